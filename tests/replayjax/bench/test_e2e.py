import dataclasses
import json

import jax.numpy as jnp
import numpy as np
import pytest

from models.config import load_config
from models.qwen import QwenHybrid
from models.runner import Runner
from replayjax import commandline as cli
from replayjax import memory
from replayjax.bench import e2e, synthetic, workload
from tests.replayjax.test_tokenizer_prompts import model_dir_with_tokenizer

QWEN = "tests/fixtures/hf/qwen3_next"
NEMOTRON = "tests/fixtures/hf/nemotron_h"
SMALL = ["--batch", "2", "--prompt-len", "6", "--new-tokens", "10", "--window", "4",
         "--steps-per-visit", "4"]


def test_ab_bench_runs_every_variant_with_its_roofline(capsys):
    assert e2e.main(["--model", QWEN, *SMALL, "--variants", "standard", "replay",
                     "replay+ngram", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["variant"]: r for r in out["rows"]}
    assert list(rows) == ["standard", "replay", "replay+ngram"]
    assert all(r["failures"] == 0 and r["tokens_per_s"] > 0 and r["compile_s"] > 0
               for r in rows.values())
    assert rows["replay+ngram"]["accepted_per_verify"] is not None
    assert out["config"]["workload"] == "mixed" and out["workload"].startswith("mixed prompts")
    assert out["config"]["arrivals"] == "staggered" and "staggered arrivals" in out["workload"]
    for v in ("standard", "replay"):      # decode rows: minimum bytes, ideal time, achieved share
        r = rows[v]
        assert r["ideal_step_ms"] == pytest.approx(r["min_mb_per_step"] * 1e6 /
                                                   (r["copy_gbs"] * 1e9) * 1e3)
        assert r["of_roofline"] == pytest.approx(r["ideal_step_ms"] / r["step_ms"])
        # no bf16 peak on a CPU: the FLOPs are counted but the ideal is the bytes' alone
        assert r["peak_tflops"] is None and r["ideal_flops_ms"] is None
        assert r["ideal_bytes_ms"] == pytest.approx(r["ideal_step_ms"]) and r["bound"] == "bytes"
        assert set(r["roofline_bound"].values()) == {"bytes"} and r["min_gflop_per_step"] > 0
        assert set(r["roofline_mb"]) == {"ssm", "gemm", "attention", "moe", "sampling",
                                          "collective", "other"}
    # ReplaySSM reads the state once and writes it once per L steps: less SSM traffic
    assert rows["replay"]["roofline_mb"]["ssm"] < rows["standard"]["roofline_mb"]["ssm"]
    assert rows["replay"]["roofline_mb"]["gemm"] == rows["standard"]["roofline_mb"]["gemm"]
    assert "ideal_step_ms" not in rows["replay+ngram"]           # a verify step: no decode model
    assert all(r["peak_mem_scope"] == "process" for r in rows.values())


def test_roofline_with_a_peak_takes_per_class_the_larger_bound(capsys):
    """--peak-tflops: per class the larger of the bytes at the copy bandwidth and the FLOPs at
    the peak, summed; a peak so low that every class doing FLOPs is flops-bound."""
    argv = ["--model", NEMOTRON, *SMALL, "--variants", "replay", "--isolate", "none",
            "--peak-tflops", "1e-6"]
    assert e2e.main(argv + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (r,) = out["rows"]
    peak, bw = 1e6, r["copy_gbs"] * 1e9
    assert r["peak_tflops"] == out["config"]["peak_tflops"] == 1e-6
    ideal = {c: max(r["roofline_mb"][c] * 1e6 / bw, r["roofline_gflop"][c] * 1e9 / peak)
             for c in r["roofline_mb"]}
    assert r["ideal_step_ms"] == pytest.approx(sum(ideal.values()) * 1e3)
    assert r["ideal_bytes_ms"] == pytest.approx(r["min_mb_per_step"] * 1e6 / bw * 1e3)
    assert r["ideal_flops_ms"] == pytest.approx(r["min_gflop_per_step"] * 1e9 / peak * 1e3)
    assert r["ideal_step_ms"] > r["ideal_flops_ms"] > r["ideal_bytes_ms"]
    assert r["roofline_bound"] == dict(ssm="flops", gemm="flops", attention="flops",
                                       moe="flops", sampling="bytes", collective="bytes",
                                       other="bytes")
    assert r["bound"] == "flops" and r["of_roofline"] == pytest.approx(
        r["ideal_step_ms"] / r["step_ms"])
    e2e.print_table(e2e.parse_args(argv), out["rows"], out["workload"])
    table = capsys.readouterr().out
    assert "; bf16 peak 1e-06 TFLOP/s\n" in table
    assert f"| {r['ideal_step_ms']:.2f} ({r['of_roofline']:.0%}, flops) |" in table


def test_mixed_workload_spreads_prompt_lengths_and_sync_does_not():
    mixed = workload.synthetic_requests(256, 128, 64, 1000, seed=3, workload="mixed")
    lengths = np.array([len(r.prompt) for r in mixed])
    assert lengths.min() >= 32 and lengths.max() <= 512 and len(set(lengths)) > 100
    assert np.exp(np.log(lengths).mean()) == pytest.approx(128, rel=0.15)    # geometric mean P
    sync = workload.synthetic_requests(4, 128, 64, 1000, workload="sync")
    assert {len(r.prompt) for r in sync} == {128}
    again = workload.synthetic_requests(256, 128, 64, 1000, seed=3, workload="mixed")
    assert [r.prompt for r in again] == [r.prompt for r in mixed]            # seeded
    assert all(3 <= t < 1000 for r in mixed for t in r.prompt)


def test_arrival_schedules():
    assert workload.arrival_times(3).tolist() == [0, 0, 0]
    assert workload.arrival_times(4, 2.0, "uniform").tolist() == [0, 0.5, 1.0, 1.5]
    poisson = workload.arrival_times(20_000, 50.0, "poisson", seed=1)
    assert poisson[0] == 0 and (np.diff(poisson) >= 0).all()
    assert np.diff(poisson).mean() == pytest.approx(1 / 50, rel=0.05)
    assert (poisson == workload.arrival_times(20_000, 50.0, "poisson", seed=1)).all()
    with pytest.raises(ValueError, match="need a rate"):
        workload.arrival_times(3, None, "poisson")
    staggered = workload.arrival_times(500, pattern="staggered", seed=2, span=8)
    assert staggered[0] == 0 and set(staggered.tolist()) == set(range(8))       # host visits
    assert workload.arrival_unit("staggered") == "visit" and workload.arrival_unit("poisson") == "s"


@pytest.mark.parametrize("variant", ["replay+ngram"])    # plain decode visits run in it too
def test_staggered_arrivals_admit_rows_between_visits_with_the_same_tokens(variant):
    """Requests submitted at later host visits (live admission) generate exactly what a burst at
    t = 0 generates, while rows joining mid-flight start their ring cursors at other steps."""
    from convert import load_hf
    from replayjax.engine import Engine
    _, model = load_hf(QWEN)
    reqs = workload.synthetic_requests(6, 6, 10, model.cfg.vocab_size, seed=1)
    mode, _, drafter = variant.partition("+")
    out = {}
    for pattern, span in (("burst", 1), ("staggered", 3)):
        arrivals = workload.arrival_times(len(reqs), pattern=pattern, seed=4, span=span)
        wl = workload.Workload(tuple(reqs), tuple(arrivals), pattern,
                               workload.arrival_unit(pattern))
        engine = Engine(model, num_slots=3, max_len=64, window=4, steps_per_visit=4,
                        num_draft=2 if drafter else 0, drafter=drafter or None, ssm_mode=mode)
        out[pattern] = [c.tokens for c in e2e.serve(engine, wl)]
        if pattern == "staggered":
            assert len(set(arrivals.tolist())) > 1
            kinds = [k for k, *_ in engine.visits]
            first_step = next(i for i, k in enumerate(kinds) if k != "prefill")
            assert "prefill" in kinds[first_step:]         # admitted after decoding started
    assert out["staggered"] == out["burst"]


def test_randomize_gives_nondegenerate_weights():
    cfg = load_config(QWEN)
    model = synthetic.randomize(QwenHybrid(cfg), seed=1)
    gdn = model.layers[0].mixer
    assert float(jnp.std(gdn.in_proj.kernel[...])) > 0.05
    assert float(jnp.std(model.layers[0].mlp.gate_w[...])) > 0.05      # no zero experts
    dt = np.log1p(np.exp(np.asarray(gdn.dt_bias[...])))
    assert ((dt > 9e-4) & (dt < 0.11)).all()
    runner = Runner(model)
    logits, _ = runner.prefill(runner.init_cache(2, 16), jnp.ones((1, 4), jnp.int32),
                               jnp.asarray([4]), jnp.asarray([1], jnp.int32))
    assert np.isfinite(np.asarray(logits)).all() and float(jnp.std(logits)) > 0.1


# ---------------------------------------------------------------------- traces and MTP

def _capture_run(monkeypatch):
    """Keeps what `e2e.run` returns (rows, completions per variant) and its args."""
    seen = {}
    real = e2e.run

    def run(args, argv=()):
        seen["args"] = args
        seen["rows"], seen["outputs"], what = real(args, argv)
        return seen["rows"], seen["outputs"], what

    monkeypatch.setattr(e2e, "run", run)
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
    assert e2e.main(["--model", d, "--trace", trace, "--batch", "2", "--window", "4",
                     "--steps-per-visit", "4", "--variants", "standard", "replay",
                     "replay+ngram", "replay+mtp", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["variant"]: r for r in out["rows"]}
    assert list(rows) == ["standard", "replay", "replay+ngram", "replay+mtp"]
    assert out["config"]["variants"] == list(rows) and "requests" not in out["config"]
    # the fixture ships no MTP weights: a failed row, not a crash
    assert rows["replay+mtp"]["failures"] == 5 and "MTP head" in rows["replay+mtp"]["error"]
    ok = [rows[v] for v in ("standard", "replay", "replay+ngram")]
    assert all(r["requests"] == r["completed"] == 5 and r["failures"] == 0 for r in ok)
    assert all(r["greedy_match_vs_standard"] == r["greedy_prefix_vs_standard"] == 1.0 for r in ok)

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
    ({"prompt": "the \ud800cat", "max_new_tokens": 4},      # JSON's escape, no Unicode text
     "field 'prompt' must be a non-empty string of valid Unicode"),
    ("[" * 100_000, "the JSON nests too deeply"),
    ({"prompt_ids": [1, 128], "max_new_tokens": 4},
     "field 'prompt_ids' has token ids [128] outside"),
    ({"prompt_ids": [1], "max_new_tokens": 4, "stop_ids": [-1]}, "field 'stop_ids' has token ids"),
    ({"prompt_ids": [1], "max_new_tokens": 4, "top_k": 2 ** 31},
     "field 'top_k' must be an integer in [0, 2^31)"),
])
def test_bad_trace_line_names_file_line_and_field(tmp_path, line, msg, capsys):
    trace = _write_trace(tmp_path / "t.jsonl", [{"prompt_ids": [1, 2, 3], "max_new_tokens": 2},
                                                line])
    assert e2e.main(["--model", NEMOTRON, "--trace", trace]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"replayjax bench: error: {trace}:2: ") and msg in err
    assert len(err.strip().splitlines()) == 1


def test_duplicate_trace_ids_are_named(tmp_path, capsys):
    """Two lines of one id are refused as the trace is read, before any model is built."""
    line = {"prompt_ids": [1, 2], "max_new_tokens": 2, "id": "a"}
    trace = _write_trace(tmp_path / "t.jsonl", [line, {**line, "id": "b"}, line])
    assert e2e.main(["--model", NEMOTRON, "--trace", trace]) == 1
    assert capsys.readouterr().err == (f"replayjax bench: error: {trace}:3: field 'id' 'a' is "
                                       f"already the id of {trace}:1\n")


@pytest.mark.parametrize("argv,msg", [
    (["--variants", "replay+medusa"], "argument --variants: variant 'replay+medusa' is not"),
    (["--variants", "replay", "replay"], "argument --variants: replay given twice"),
    (["--variants", "standard@cuda"], "argument --variants: variant 'standard@cuda' is not"),
    (["--trace", "t.jsonl", "--new-tokens", "8"], "argument --new-tokens: describes synthetic"),
    (["--batch", "0"], "argument --batch: must be >= 1, got 0"),
    (["--arrivals", "poisson"], "argument --rate: arrivals poisson need a rate"),
    (["--rate", "5"], "argument --rate: arrivals staggered take no rate"),
    (["--arrivals", "uniform", "--rate", "0"], "argument --rate: must be a finite number > 0"),
    (["--prompt-len", "0"], "argument --prompt-len: must be >= 1, got 0"),
    (["--new-tokens", "-1"], "argument --new-tokens: must be >= 1, got -1"),
    (["--window", "6"], "argument --window: must be a power of two in [1, 64], got 6"),
    (["--num-draft", "9"], "argument --num-draft: must be in [1, 7], got 9"),
    (["--variants", "replay+ngram", "--num-draft", "4", "--window", "4"],
     "argument --num-draft: K = 4 must be < --window 4"),
    (["--steps-per-visit", "0"], "argument --steps-per-visit: must be >= 1, got 0"),
    (["--batch", "two"], "argument --batch: expected an integer, got 'two'"),
    (["--peak-tflops", "0"], "argument --peak-tflops: must be a finite number > 0, got 0"),
    (["--peak-tflops", "-1"], "argument --peak-tflops: must be a finite number > 0, got -1"),
    (["--peak-tflops", "nan"], "argument --peak-tflops: must be a finite number > 0, got nan"),
])
def test_bad_arguments_are_one_line_exit_2(argv, msg, capsys):
    with pytest.raises(SystemExit) as e:
        e2e.main(["--model", NEMOTRON] + argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and msg in err and len(err.strip().splitlines()) == 1
    assert err.startswith("replayjax bench: error: ")


@pytest.mark.parametrize("argv,msg", [
    (["--model", "no/such/dir"], "--model: model directory 'no/such/dir' does not exist"),
    (["--model", NEMOTRON, "--trace", "no/such.jsonl"], "--trace no/such.jsonl: no such file"),
    (["--model", NEMOTRON, "--tokenizer", "no/tok.json", "--trace", "x"],
     "--tokenizer no/tok.json: no such file"),
])
def test_missing_inputs_fail_before_any_work(argv, msg, capsys):
    assert e2e.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"replayjax bench: error: {msg}") and len(err.splitlines()) == 1


def test_errors_are_one_line_unless_debug(monkeypatch, capsys):
    def boom(args, argv=()):
        raise RuntimeError("kernel exploded\nwith a second line")
    monkeypatch.setattr(e2e, "run", boom)
    assert e2e.main(["--model", NEMOTRON]) == 1
    assert capsys.readouterr().err == ("replayjax bench: error: RuntimeError: kernel exploded "
                                       "(--debug shows the traceback)\n")
    with pytest.raises(RuntimeError, match="kernel exploded"):
        e2e.main(["--model", NEMOTRON, "--debug"])


def test_a_model_that_does_not_fit_is_refused_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(memory, "free_memory", lambda host=False: (24e9, "the device"))
    assert e2e.main(["--synthetic", "qwen3-next-80b-a3b", "--isolate", "none"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("replayjax bench: error: qwen3-next-80b-a3b in bfloat16 needs ~")
    assert err.endswith("GB; the device has 24.0 GB free")
    need = float(err.split("~")[1].split()[0])
    assert 155 <= need <= 175                    # 79.7B bf16 weights + one fp32 temporary


TINY_MTP = dict(
    model_type="nemotron_h", vocab_size=128, hidden_size=32, hybrid_override_pattern="M*M-",
    num_attention_heads=4, num_key_value_heads=2, head_dim=8, mamba_num_heads=4, mamba_head_dim=8,
    n_groups=2, ssm_state_size=16, conv_kernel=4, intermediate_size=64, layer_norm_epsilon=1e-5)


def test_mtp_variant_on_a_synthetic_model(monkeypatch, capsys):
    monkeypatch.setitem(synthetic.SYNTHETIC, "tiny", TINY_MTP)
    monkeypatch.setitem(synthetic.SYNTHETIC_MTP, "tiny", dict(num_nextn_predict_layers=1,
                                                              mtp_hybrid_override_pattern="*-"))
    seen = _capture_run(monkeypatch)
    assert e2e.main(["--synthetic", "tiny", "--dtype", "float32", "--batch", "3", "--prompt-len",
                     "6", "--new-tokens", "9", "--window", "4", "--steps-per-visit", "4",
                     "--workload", "sync", "--variants", "replay", "replay+mtp"]) == 0
    table = capsys.readouterr().out
    assert "| replay+mtp | " in table and "(verify)" in table and "failed" not in table
    assert "sync prompts (mean 6 tokens, 6-6)" in table
    assert "; no bf16 peak known (--peak-tflops): ideal from bytes alone\n" in table
    assert "%, bytes) |" in table                    # the decode row's roofline: bytes alone
    out = seen["outputs"]
    assert [c.tokens for c in out["replay+mtp"]] == [c.tokens for c in out["replay"]]
    assert sum(e2e.acceptance_histogram(out["replay+mtp"], 3)) == \
        sum(c.verify_steps for c in out["replay+mtp"]) > 0


def test_variants_pick_their_kernels_and_compare_greedy_tokens(monkeypatch, capsys):
    """standard@xla standard@pallas: the Pallas decode attention runs in that variant only, and
    its greedy agreement with the first standard row (the XLA one) is in the table."""
    monkeypatch.setitem(synthetic.SYNTHETIC, "tiny", dict(TINY_MTP, head_dim=16))
    from pallas_kernels.attention import api
    impls, pallas_rows = api._OPS["decode_attention"].impls, []
    real = impls["pallas_triton"]
    monkeypatch.setitem(impls, "pallas_triton", lambda *a, **kw: (
        pallas_rows.append(a[0].shape[0]), real(*a, **kw))[1])
    seen = _capture_run(monkeypatch)
    assert e2e.main(["--synthetic", "tiny", "--batch", "3", "--prompt-len", "6", "--new-tokens",
                     "6", "--window", "4", "--steps-per-visit", "4", "--isolate", "none",
                     "--variants", "standard@xla", "standard@pallas"]) == 0
    table = capsys.readouterr().out
    assert "| greedy = standard | greedy prefix |" in table
    assert "| standard@xla | " in table and "| standard@pallas | " in table
    assert "failed" not in table and pallas_rows        # traced in the Pallas variant
    rows, out = {r["variant"]: r for r in seen["rows"]}, seen["outputs"]
    assert rows["standard@xla"]["greedy_prefix_vs_standard"] == 1.0       # the reference
    tokens = {v: [c.tokens for c in out[v]] for v in rows}
    assert (rows["standard@pallas"]["greedy_match_vs_standard"],
            rows["standard@pallas"]["greedy_prefix_vs_standard"]) == e2e.greedy_agreement(
                tokens["standard@pallas"], tokens["standard@xla"], [0, 1, 2])


def test_isolated_variants_run_in_fresh_processes(capsys):
    """--isolate process: one child process per variant (same arguments, one variant each);
    their rows and tokens come back and are compared as in one process."""
    assert e2e.main(["--model", NEMOTRON, *SMALL, "--isolate", "process", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["variant"] for r in rows] == ["standard", "replay"]
    assert all(r["peak_mem_scope"] == "variant" and r["failures"] == 0 for r in rows)
    assert rows[1]["greedy_match_vs_standard"] == 1.0 and rows[1]["ideal_step_ms"] > 0


def test_isolated_run_keeps_finished_variants_when_stopped(monkeypatch, capsys):
    """A SIGTERM (a `timeout` running out) during the second variant's child: the first
    variant's row is still printed, the stopped and unstarted ones as failed rows; a child that
    fails after the first gives a failed row, not a refused run."""
    done = {"rows": [{"variant": "standard", "step_ms": 1.0, "tokens_per_s": 1.0}],
            "tokens": {"standard": [[1, 2], [3]]}, "workload": "w"}

    def child(stop):
        def run(name, argv, progress):
            if name == "standard":
                return done
            if stop:
                raise e2e._Stopped
            raise cli.UserError("out of memory in the child")
        return run

    argv = ["--model", NEMOTRON, *SMALL, "--isolate", "process", "--json", "--variants",
            "standard", "replay", "replay+ngram"]
    monkeypatch.setattr(e2e, "_run_child", child(stop=True))
    assert e2e.main(argv) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["variant"], r.get("error")) for r in rows] == [
        ("standard", None), ("replay", "stopped (SIGTERM) before it ended"),
        ("replay+ngram", "stopped (SIGTERM) before it ended")]
    monkeypatch.setattr(e2e, "_run_child", child(stop=False))
    assert e2e.main(argv[:-1]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["variant"], r.get("error")) for r in rows] == [
        ("standard", None), ("replay", "out of memory in the child")]
    monkeypatch.setattr(e2e, "_run_child", lambda *a: (_ for _ in ()).throw(
        e2e._Stopped()))             # every variant failed: the rows, then exit status 1
    assert e2e.main(argv[:-1]) == 1
    out, err = capsys.readouterr()
    stopped = "stopped (SIGTERM) before it ended"
    assert [r["error"] for r in json.loads(out)["rows"]] == [stopped] * 2
    assert err == ("replayjax bench: error: every variant failed (first: standard: stopped "
                   "(SIGTERM) before it ended)\n")


@pytest.mark.parametrize("name", sorted(synthetic.SYNTHETIC))
def test_synthetic_presets_parse_and_describe_an_mtp_head(name):
    from flax import nnx

    from models.registry import model_class
    cfg = synthetic.synthetic_config(name, mtp=True)
    model = nnx.eval_shape(lambda: model_class(cfg)(cfg, dtype=jnp.bfloat16, mtp=True))
    assert model.mtp is not None and len(model.mtp.layers) >= 1


@pytest.mark.parametrize("name,params_b", [("nemotron-nano-9b-v2", 8.89),
                                           ("nemotron-3-nano-30b-a3b", 31.6),
                                           ("qwen3.5-35b-a3b", 34.7),
                                           ("qwen3-next-80b-a3b", 79.7)])
def test_presets_have_their_published_size(name, params_b):
    total, _ = synthetic.param_bytes(synthetic.synthetic_config(name), jnp.bfloat16)
    assert total / 2 / 1e9 == pytest.approx(params_b, rel=0.01)


def test_acceptance_per_step_from_recorded_cache_lengths():
    from replayjax.engine import Completion
    # steps at cache lengths 10, 13, 14 (2 then 0 accepted), last step 1 more: 3 in all
    c = Completion(0, [0] * 6, "length", 0.0, 1.0, verify_steps=3, accepted_drafts=3,
                   drafts=[(10, []), (13, []), (14, [])])
    assert e2e.accepted_per_step(c) == [2, 0, 1]
    assert e2e.acceptance_histogram([c], 3) == [1, 1, 1, 0]
    c.drafts = [(10, []), (9, [])]                # bookkeeping that does not add up
    assert e2e.acceptance_histogram([c], 3) is None



def test_agents_workload_shares_and_extends_prefixes():
    """Turn-major requests of ceil(n / turns) agents: every prompt starts with the shared system
    prompt, an agent's turn extends its previous turn's prompt by a reply and a new message;
    deterministic in the seed."""
    reqs = workload.synthetic_requests(10, 32, 6, 1000, seed=2, workload="agents")
    agents, msg = 3, 32 // workload.AGENT_MESSAGE
    system = reqs[0].prompt[:32]
    assert all(r.prompt[:32] == system and r.max_new_tokens == 6 for r in reqs)
    for i in range(agents, len(reqs)):
        prev = reqs[i - agents].prompt
        assert reqs[i].prompt[:len(prev)] == prev and len(reqs[i].prompt) == len(prev) + 6 + msg
    assert len({r.prompt[32:] for r in reqs[:agents]}) == agents
    again = workload.synthetic_requests(10, 32, 6, 1000, seed=2, workload="agents")
    assert [r.prompt for r in again] == [r.prompt for r in reqs]


def test_agents_with_prefix_cache_reports_both_ttfts(capsys):
    """--workload agents --prefix-cache-gb: each variant runs without and with the cache (rows
    VARIANT and VARIANT+prefix, TTFT in both), with the same greedy tokens; the cached row
    reports its hit rate and the memory its pool takes (within --prefix-cache-gb)."""
    assert e2e.main(["--model", NEMOTRON, "--batch", "6", "--prompt-len", "16", "--new-tokens",
                     "3", "--window", "4", "--steps-per-visit", "4", "--workload", "agents",
                     "--prefix-cache-gb", "0.001", "--prefix-block", "8", "--variants",
                     "standard", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["variant"] for r in rows] == ["standard", "standard+prefix"]
    assert all(r["failures"] == 0 and r["ttft_p50_s"] > 0 for r in rows)
    assert rows[1]["prefix_hit_rate"] > 0.3 and rows[1]["greedy_match_vs_standard"] == 1.0
    assert 0 < rows[1]["prefix_used_gb"] <= rows[1]["prefix_pool_gb"] <= 0.001


def test_greedy_agreement_tells_late_divergence_from_a_wrong_first_token():
    ref = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9], [1, 2, 3, 4], [7, 7, 7, 7]]
    out = [[1, 2, 3, 4],            # equal: 4 / 4
           [5, 6, 7, 0],            # last token differs: 3 / 4
           [0, 9],                  # first token differs: 0 / 2
           [1, 2],                  # stopped early (a stop id): 2 of the longer 4
           [0, 0, 0, 0]]            # sampled (not in greedy): ignored
    match, prefix = e2e.greedy_agreement(out, ref, [0, 1, 2, 3])
    assert match == 1 / 4 and prefix == pytest.approx((1 + 3 / 4 + 0 + 2 / 4) / 4)
    assert e2e.greedy_agreement(out, ref, [0]) == (1.0, 1.0)
    assert e2e.greedy_agreement([[]], [[]], [0]) == (1.0, 1.0)
    assert e2e.greedy_agreement(out, ref, []) == (None, None)


def test_kernel_impls_are_the_registrys():
    from pallas_kernels.dispatch import IMPLS
    assert set(e2e.KERNEL_IMPLS) == set(IMPLS)


def test_requests_the_engine_could_not_serve_fail_their_variant(monkeypatch, capsys):
    """Completions that finished with finish_reason "error" (their prefill failed, the engine
    went on) make their variant a failed row saying how many and why, not a timed one; with
    every variant failed the exit status is 1."""
    real = e2e.serve

    def serve(engine, workload):
        out = real(engine, workload)
        return [dataclasses.replace(c, finish_reason="error", error="the prefill failed (X)")
                if i == 0 else c for i, c in enumerate(out)]

    monkeypatch.setattr(e2e, "serve", serve)
    argv = ["--model", NEMOTRON, *SMALL, "--variants", "replay", "--isolate", "none", "--json"]
    assert e2e.main(argv) == 1
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    assert (row["failures"], row["error"]) == (1, "1 of 2 requests failed: the prefill failed (X)")
