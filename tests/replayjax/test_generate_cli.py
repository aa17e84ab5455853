import json

import pytest

from replayjax import generate_cli


def test_generate_json_matches_hf_greedy(capsys):
    import numpy as np
    ref = np.load("tests/fixtures/hf/nemotron_h/reference.npz")
    p = ref["prompts"][0][:ref["prompt_lens"][0]]
    generate_cli.main(["--model", "tests/fixtures/hf/nemotron_h", "--prompt-ids",
                       ",".join(map(str, p)), "--max-new-tokens", "10", "--window", "4",
                       "--num-slots", "1", "--max-len", "64", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["results"][0]["tokens"] == list(ref["greedy_tokens"][0, :10])


@pytest.mark.parametrize("argv,msg", [
    (["--model", "/nonexistent", "--prompt-ids", "1,2"], "does not exist"),
    (["--model", "tests/fixtures/hf/nemotron_h", "--prompt-ids", "1,999"], "out of the vocabulary"),
    (["--model", "tests/fixtures/hf/nemotron_h"], "at least one --prompt"),
    (["--model", "tests/fixtures/hf/nemotron_h", "--prompt", "hi"], "tokenizer.json"),
    (["--model", "tests/fixtures/hf/nemotron_h", "--prompt-ids", "1", "--speculative", "draft"],
     "not available"),
    (["--model", "tests/fixtures/hf/nemotron_h", "--prompt-ids", "1", "--speculative", "mtp"],
     "needs a model with an MTP head"),
])
def test_generate_errors(argv, msg, capsys):
    with pytest.raises(SystemExit) as e:
        generate_cli.main(argv)
    assert msg in str(e.value)
