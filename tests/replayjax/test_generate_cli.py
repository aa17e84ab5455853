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


SMALL = ["--model", "tests/fixtures/hf/nemotron_h", "--max-new-tokens", "3", "--window", "4",
         "--num-slots", "2", "--max-len", "32"]


def test_several_prompts_get_a_header_each_and_progress_on_a_terminal(monkeypatch, capsys):
    """Text output: each completion after a header naming its index and prompt; on a terminal
    the stages of the run are shown on stderr, then a summary without compilation."""
    monkeypatch.setattr(generate_cli.cli, "interactive", lambda args: True)
    assert generate_cli.main(SMALL + ["--prompt-ids", "1,2,3", "--prompt-ids", "4,5"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0] == "==> prompt 1/2: ids 1,2,3 <==" and lines[2] == ""
    assert lines[3] == "==> prompt 2/2: ids 4,5 <==" and len(lines) == 5
    assert all(len(line.split()) == 3 for line in (lines[1], lines[4]))      # 3 token ids each
    for stage in ("loading the model", "compiling (warm-up)", "generating 2 prompt(s)"):
        assert stage in err
    assert err.rstrip().splitlines()[-1].startswith("[6 tokens in ")


def test_jsonl_is_one_object_per_prompt_and_json_reports_compilation_apart(capsys):
    argv = SMALL + ["--prompt-ids", "1,2,3", "--prompt-ids", "4,5"]
    assert generate_cli.main(argv + ["--jsonl"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["index"], r["prompt_ids"], len(r["tokens"])) for r in rows] == [
        (0, [1, 2, 3], 3), (1, [4, 5], 3)]
    assert generate_cli.main(argv + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["tokens"] for r in out["results"]] == [r["tokens"] for r in rows]
    assert out["tokens"] == 6 and out["compile_s"] > 0 and out["load_s"] > 0
    # the timed run is the generation alone: compiled before, so much faster than compiling
    assert out["tokens_per_s"] == pytest.approx(6 / out["generate_s"], rel=0.05)
    assert out["generate_s"] < out["compile_s"]


def test_logprobs_in_json_rows(capsys):
    """--logprobs N: each result lists its tokens' (logprob, N alternatives); greedy tokens are
    their own most likely alternative."""
    assert generate_cli.main(SMALL + ["--prompt-ids", "1,2,3", "--logprobs", "2",
                                      "--jsonl"]) == 0
    [row] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(row["logprobs"]) == len(row["tokens"]) == 3
    for token, (lp, alts) in zip(row["tokens"], row["logprobs"]):
        assert len(alts) == 2 and alts[0] == [token, lp] and lp >= alts[1][1] and lp <= 0


def test_a_request_the_engine_could_not_serve_is_one_line(monkeypatch, capsys):
    """A completion that finished with finish_reason "error" (its prefill failed and the engine
    went on) is not printed as an empty output: one line naming the prompt and why, exit 1."""
    from replayjax.engine import Completion, Engine

    monkeypatch.setattr(Engine, "generate", lambda self, reqs, on_tokens=None: [
        Completion(r.id, [], "error", float("nan"), 0.0, error="the prefill failed (X: y)")
        for r in reqs])
    assert generate_cli.main(["--prompt-ids", "1,2", "--max-new-tokens", "2"]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        "replayjax generate: error: prompt 1 of 1: the prefill failed (X: y)")
