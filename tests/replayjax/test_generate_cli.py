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
     "give the draft model's directory: draft:DIR"),
    (["--model", "tests/fixtures/hf/nemotron_h", "--prompt-ids", "1", "--speculative", "eagle"],
     "not available"),
    (["--model", "tests/fixtures/hf/nemotron_h", "--prompt-ids", "1", "--speculative",
      "draft:/nonexistent"], "--speculative draft: model directory '/nonexistent' does not exist"),
    (["--model", "tests/fixtures/hf/nemotron_h", "--prompt-ids", "1", "--save-logits",
      "/nonexistent/x.npy"], "directory '/nonexistent' does not exist"),
    (["--model", "tests/fixtures/hf/nemotron_h", "--prompt-ids", "1", "--speculative", "mtp"],
     "needs a model with an MTP head"),
    (["--model", "tests/fixtures/hf/nemotron_h", "--prompt-ids", "1", "--prompt-ids", "2",
      "--stream"], "give a single prompt and no --json"),
    (["--model", "tests/fixtures/hf/nemotron_h", "--prompt-ids", "1", "--stream", "--json"],
     "give a single prompt and no --json"),
    (["--model", "tests/fixtures/hf/nemotron_h", "--prompt-ids", "1", "--steps-per-visit", "0"],
     "steps_per_visit must be >= 1"),
    (["--model", "tests/fixtures/hf/nemotron_h", "--prompt-ids", "1", "--num-draft", "2"],
     "--num-draft needs --speculative"),
    (["--model", "tests/fixtures/hf/nemotron_h", "--prompt-ids", "1", "--speculative", "ngram",
      "--num-draft", "0"], "drafter='ngram' proposes num_draft >= 1 tokens per step"),
    (["--model", "tests/fixtures/hf/nemotron_h", "--prompt-ids", "1", "--temperature", "inf"],
     "request 0: sampling.temperature must be a finite number >= 0"),
    (["--model", "tests/fixtures/hf/nemotron_h", "--prompt-ids", "1", "--top-p", "2"],
     "request 0: sampling.top_p must be a number in (0, 1]"),
])
def test_generate_errors(argv, msg, capsys):
    with pytest.raises(SystemExit) as e:
        generate_cli.main(argv)
    assert msg in str(e.value)


def test_generate_draft_speculation_saves_logits(tmp_path, capsys):
    """--speculative draft:DIR gives HF's greedy tokens; --save-logits writes [prompts,
    max_new_tokens, vocab] fp32 with the logits of every generated token (their argmax: the greedy
    tokens) and NaN rows past a request that stopped early."""
    import numpy as np
    ref = np.load("tests/fixtures/hf/qwen3_5/reference.npz")
    prompts = [ref["prompts"][i][:ref["prompt_lens"][i]] for i in range(2)]
    want = ref["greedy_tokens"]
    stop = int(want[1, 3])
    stopped = list(want[1]).index(stop) + 1
    path = tmp_path / "logits"                               # written as named, no ".npy" added
    argv = ["--model", "tests/fixtures/hf/qwen3_5", "--speculative",
            "draft:tests/fixtures/hf/nemotron_h", "--num-draft", "2", "--max-new-tokens", "8",
            "--window", "4", "--num-slots", "1", "--max-len", "64", "--json",
            "--stop-ids", str(stop), "--save-logits", str(path)]
    for p in prompts:
        argv += ["--prompt-ids", ",".join(map(str, p))]
    assert generate_cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out)["results"]
    assert out[1]["tokens"] == list(want[1, :stopped]) and stopped < 8
    logits = np.load(path)
    assert logits.shape == (2, 8, 128) and logits.dtype == np.float32
    for i, r in enumerate(out):
        n = len(r["tokens"])
        assert list(logits[i, :n].argmax(-1)) == r["tokens"] == list(want[i, :n])
        assert np.isnan(logits[i, n:]).all() and not np.isnan(logits[i, :n]).any()


def test_stream_without_tokenizer_prints_the_ids(capsys):
    """A model dir without tokenizer.json streams token ids, the same line the batch output
    prints."""
    argv = ["--model", "tests/fixtures/hf/nemotron_h", "--prompt-ids", "3,17,42",
            "--max-new-tokens", "9", "--steps-per-visit", "2", "--window", "4", "--num-slots",
            "1", "--max-len", "64"]
    outs = []
    for extra in ([], ["--stream"]):
        assert generate_cli.main(argv + extra) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and len(outs[0].split()) == 9
