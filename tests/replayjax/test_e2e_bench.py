import json

import jax.numpy as jnp
import numpy as np
import pytest

from models.config import load_config
from models.qwen import QwenHybrid
from models.runner import Runner
from replayjax import e2e_bench
from tests.replayjax.test_tokenizer_prompts import model_dir_with_tokenizer


def test_ab_bench_runs_every_variant(capsys):
    e2e_bench.main(["--model", "tests/fixtures/hf/qwen3_next", "--batch", "2", "--prompt-len", "6",
                    "--new-tokens", "10", "--window", "4", "--steps-per-visit", "4",
                    "--variants", "standard", "replay", "replay+ngram", "--json"])
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["variant"] for r in rows] == ["standard", "replay", "replay+ngram"]
    assert all(r["failures"] == 0 and r["tokens_per_s"] > 0 for r in rows)
    assert rows[2]["accepted_per_verify"] is not None


def test_randomize_gives_nondegenerate_weights():
    cfg = load_config("tests/fixtures/hf/qwen3_next")
    model = e2e_bench.randomize(QwenHybrid(cfg), seed=1)
    gdn = model.layers[0].mixer
    assert float(jnp.std(gdn.in_proj.kernel[...])) > 0.05
    dt = np.log1p(np.exp(np.asarray(gdn.dt_bias[...])))
    assert ((dt > 9e-4) & (dt < 0.11)).all()
    runner = Runner(model)
    logits, _ = runner.prefill(runner.init_cache(2, 16), jnp.ones((1, 4), jnp.int32),
                               jnp.asarray([4]), jnp.asarray([1], jnp.int32))
    assert np.isfinite(np.asarray(logits)).all() and float(jnp.std(logits)) > 0.1


# ---------------------------------------------------------------------- traces and MTP

def _capture_run(monkeypatch):
    """Keeps what `e2e_bench.run` returns (rows, completions per variant) and its args."""
    seen = {}
    real = e2e_bench.run

    def run(args):
        seen["args"], (rows, seen["outputs"]) = args, real(args)
        return rows, seen["outputs"]

    monkeypatch.setattr(e2e_bench, "run", run)
    return seen


def _write_trace(path, lines):
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return str(path)


def test_trace_serves_the_same_requests_in_every_variant(tmp_path, monkeypatch, capsys):
    d, tok = model_dir_with_tokenizer(tmp_path)
    trace = _write_trace(tmp_path / "trace.jsonl", [
        {"prompt_ids": [5, 6, 7, 8, 5, 6, 7], "max_new_tokens": 8},
        {"prompt": "the cat sat on the mat and the cat", "max_new_tokens": 6, "id": "text"},
        "",                                                       # blank lines are skipped
        {"prompt_ids": [3, 4] * 9, "max_new_tokens": 9, "stop_ids": [2]},
        {"prompt_ids": [20, 21], "max_new_tokens": 5, "temperature": 0.8, "top_k": 20,
         "top_p": 0.9, "seed": 3},
        {"prompt_ids": [30, 31, 32, 33], "max_new_tokens": 7},
    ])
    seen = _capture_run(monkeypatch)
    e2e_bench.main(["--model", d, "--trace", trace, "--batch", "2", "--window", "4",
                    "--steps-per-visit", "4", "--variants", "standard", "replay", "replay+ngram",
                    "replay+mtp", "--json"])
    out = json.loads(capsys.readouterr().out)
    rows = {r["variant"]: r for r in out["rows"]}
    assert list(rows) == ["standard", "replay", "replay+ngram", "replay+mtp"]
    assert out["config"]["variants"] == list(rows) and "requests" not in out["config"]
    # the fixture ships no MTP weights: a failed row, not a crash
    assert rows["replay+mtp"]["failures"] == 5 and "MTP head" in rows["replay+mtp"]["error"]
    ok = [rows[v] for v in ("standard", "replay", "replay+ngram")]
    assert all(r["requests"] == r["completed"] == 5 and r["failures"] == 0 for r in ok)
    assert all(r["greedy_match_vs_standard"] == 1.0 for r in ok)

    reqs, outputs = seen["args"].requests, seen["outputs"]
    assert list(reqs[1].prompt) == tok.encode("the cat sat on the mat and the cat").ids
    assert [c.id for c in outputs["replay"]] == [reqs[0].id, "text", reqs[2].id, reqs[3].id,
                                                 reqs[4].id]
    greedy = [0, 1, 2, 4]                               # request 3 samples
    for v in ("replay", "replay+ngram"):
        assert [outputs[v][i].tokens for i in greedy] == \
            [outputs["standard"][i].tokens for i in greedy]
    assert [len(c.tokens) for c in outputs["standard"]][:2] == [8, 6]
    spec = rows["replay+ngram"]
    assert spec["step_kind"] == "verify" and len(spec["accept_hist"]) == 4
    assert sum(spec["accept_hist"]) == sum(c.verify_steps for c in outputs["replay+ngram"])
    assert rows["replay"]["accept_hist"] is None


@pytest.mark.parametrize("line,msg", [
    ('{"prompt_ids": [1, 2], "max_new_tokens": 4', "not valid JSON"),
    ('[1, 2, 3]', "expected a JSON object"),
    ({"max_new_tokens": 4}, "exactly one of 'prompt_ids'"),
    ({"prompt_ids": [1, "2"], "max_new_tokens": 4}, "field 'prompt_ids' must be a list of integer"),
    ({"prompt_ids": [1, 2.5], "max_new_tokens": 4}, "field 'prompt_ids' must be a list of integer"),
    ({"prompt_ids": [], "max_new_tokens": 4}, "field 'prompt_ids' is empty"),
    ({"prompt_ids": [1, 2]}, "missing field 'max_new_tokens'"),
    ({"prompt_ids": [1, 2], "max_new_tokens": -3},
     "field 'max_new_tokens' must be an integer >= 1"),
    ({"prompt_ids": [1, 2], "max_new_tokens": 4, "top_p": 0}, "field 'top_p'"),
    ({"prompt_ids": [1, 2], "max_new_tokens": 4, "max_tokens": 9},
     "unknown field(s) ['max_tokens']"),
    ({"prompt": "the cat", "max_new_tokens": 4}, "tokenizer.json, which does not exist"),
    ({"prompt_ids": [1, 128], "max_new_tokens": 4},
     "field 'prompt_ids' has token ids [128] outside"),
    ({"prompt_ids": [1], "max_new_tokens": 4, "stop_ids": [-1]}, "field 'stop_ids' has token ids"),
])
def test_bad_trace_line_names_file_line_and_field(tmp_path, line, msg):
    trace = _write_trace(tmp_path / "t.jsonl", [{"prompt_ids": [1, 2, 3], "max_new_tokens": 2},
                                                line])
    with pytest.raises(SystemExit) as e:
        e2e_bench.main(["--model", "tests/fixtures/hf/nemotron_h", "--trace", trace])
    assert f"{trace}:2: " in str(e.value) and msg in str(e.value)


@pytest.mark.parametrize("argv,msg", [
    (["--variants", "replay+medusa"], "is not MODE[+DRAFTER]"),
    (["--trace", "t.jsonl", "--new-tokens", "8"], "a --trace gives its own"),
])
def test_bad_arguments(argv, msg, capsys):
    with pytest.raises(SystemExit):
        e2e_bench.main(["--model", "tests/fixtures/hf/nemotron_h"] + argv)
    assert msg in capsys.readouterr().err


TINY_MTP = dict(
    model_type="nemotron_h", vocab_size=128, hidden_size=32, hybrid_override_pattern="M*M-",
    num_attention_heads=4, num_key_value_heads=2, head_dim=8, mamba_num_heads=4, mamba_head_dim=8,
    n_groups=2, ssm_state_size=16, conv_kernel=4, intermediate_size=64, layer_norm_epsilon=1e-5)


def test_mtp_variant_on_a_synthetic_model(monkeypatch, capsys):
    monkeypatch.setitem(e2e_bench.SYNTHETIC, "tiny", TINY_MTP)
    monkeypatch.setitem(e2e_bench.SYNTHETIC_MTP, "tiny", dict(num_nextn_predict_layers=1,
                                                              mtp_hybrid_override_pattern="*-"))
    seen = _capture_run(monkeypatch)
    e2e_bench.main(["--synthetic", "tiny", "--dtype", "float32", "--batch", "3", "--prompt-len",
                    "6", "--new-tokens", "9", "--window", "4", "--steps-per-visit", "4",
                    "--variants", "replay", "replay+mtp"])
    table = capsys.readouterr().out
    assert "| replay+mtp | " in table and "(verify)" in table and "failed" not in table
    out = seen["outputs"]
    assert [c.tokens for c in out["replay+mtp"]] == [c.tokens for c in out["replay"]]
    assert sum(e2e_bench.acceptance_histogram(out["replay+mtp"], 3)) == \
        sum(c.verify_steps for c in out["replay+mtp"]) > 0


@pytest.mark.parametrize("name", sorted(e2e_bench.SYNTHETIC))
def test_synthetic_configs_describe_an_mtp_head(name):
    from flax import nnx
    from models.registry import model_class
    cfg = e2e_bench.synthetic_config(name, mtp=True)
    model = nnx.eval_shape(lambda: model_class(cfg)(cfg, dtype=jnp.bfloat16, mtp=True))
    assert model.mtp is not None and len(model.mtp.layers) >= 1


def test_acceptance_per_step_from_recorded_cache_lengths():
    from replayjax.engine import Completion
    # steps at cache lengths 10, 13, 14 (2 then 0 accepted), last step 1 more: 3 in all
    c = Completion(0, [0] * 6, "length", 0.0, 1.0, verify_steps=3, accepted_drafts=3,
                   drafts=[(10, []), (13, []), (14, [])])
    assert e2e_bench.accepted_per_step(c) == [2, 0, 1]
    assert e2e_bench.acceptance_histogram([c], 3) == [1, 1, 1, 0]
    c.drafts = [(10, []), (9, [])]                # bookkeeping that does not add up
    assert e2e_bench.acceptance_histogram([c], 3) is None
