"""Kernel and verify benchmarks: the byte model, the fold-cycle arithmetic and the staggered
schedule on known inputs, and the GPU code paths run on CPU (interpret-mode Pallas) with a
stand-in for CUPTI whose launch times come from the ring counts the kernels actually saw."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.ring import advance_counts
from replayjax.bench import kernels, timing, verify
from replayjax.bench.families import FAMILIES


@pytest.mark.parametrize("family,shape,std_mb,rep_mb", [
    ("mamba2", "nemotron-h-8b", 8.43, 4.65),
    ("gdn", "qwen3-next", 4.22, 2.36),
])
def test_min_bytes_match_published_anchors(family, shape, std_mb, rep_mb):
    """Per sequence, layer and step at fp32 state, bf16 activations and ring, L = 16."""
    fam = FAMILIES[family]()
    std, rep = fam.min_bytes(fam.shapes[shape], 16, 2)
    assert round(std / 1e6, 2) == std_mb and round(rep / 1e6, 2) == rep_mb


def test_split_cycle_on_known_launch_times():
    # 3 slot sets, L = 4: counts 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3 -- the last block folds
    assert kernels.cycling_counts(3, 4).tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    launches = [1.0, 2.0, 3.0] * 3 + [10.0, 11.0, 12.0]
    assert kernels.split_cycle(launches, 3, 4) == (2.0, 11.0)


def test_cycling_schedule_is_what_advance_counts_does():
    """The step blocks split_cycle calls "fold" are exactly those where every row of the step's
    set is at count L - 1 under the kernels' own count rule."""
    n_sets, batch, L = 3, 2, 4
    sets = jnp.arange(1, n_sets * batch + 1, dtype=jnp.int32).reshape(n_sets, batch)
    counts = jnp.zeros(n_sets * batch + 1, jnp.int32)
    seen = []
    for i in range(n_sets * L):
        slots = sets[i % n_sets]
        seen.append(np.asarray(counts[slots]))
        counts = advance_counts(counts, slots, L)
    expected = kernels.cycling_counts(n_sets, L)
    assert all((c == e).all() for c, e in zip(seen, expected))


def test_staggered_schedule_mixes_fold_and_append_rows():
    counts = kernels.staggered_counts(4097, 16, seed=1)
    assert counts.min() == 0 and counts.max() == 15
    assert abs(np.mean(counts == 15) - 1 / 16) < 0.02     # ~1/L of the rows fold at every step


def counts_loop(args) -> bool:
    """Whether `kernel_times` was handed the ring counts' loop (one int32 argument)."""
    return len(args) == 1 and args[0].dtype == jnp.int32


def _recording(fam, seen):
    """`fam` whose replay kernel reports, at every launch, the ring counts of its rows."""
    def replay(b, c, inp, slots, **kw):
        jax.debug.callback(lambda cs: seen.append(np.asarray(cs)), c[slots])
        return fam.replay(b, c, inp, slots, **kw)
    return dataclasses.replace(fam, replay=replay)


@pytest.mark.parametrize("family,dims", [("mamba2", dict(H=2, P=16, N=16, G=1)),
                                         ("gdn", dict(Hk=1, Hv=2, K=16, V=16))])
def test_bench_amortises_whole_fold_cycles(monkeypatch, family, dims):
    """Runs the real jitted loops (interpret-mode Pallas); launch times are 1 us per appending
    row and 10 per folding row, from the counts the kernel saw. Both schedules must fold every
    row once per L steps (mean 1 + 9 / L), cycling must split into 1 / 10 us exactly, and the
    staggered schedule must mix folding and appending rows within steps."""
    L, seen = 4, []
    fam = _recording(FAMILIES[family](), seen)
    fam.shapes["tiny"] = dims

    def fake_kernel_times(fn, *args, iterations):
        seen.clear()
        jax.block_until_ready(fn(*args))
        if counts_loop(args):                          # the ring counts' update alone
            return [[("loop_fusion", 0.5)] * n_steps] * iterations
        if not seen:                                   # the standard kernel: 2 us per launch
            return [[("standard_decode", 2.0)] * n_steps] * iterations
        us = [float(np.mean(np.where(c == L - 1, 10.0, 1.0))) for c in seen]
        fake_kernel_times.fold_fractions.append([float(np.mean(c == L - 1)) for c in seen])
        return [[k for u in us for k in (("replay_decode", u), ("loop_fusion", 0.5))]
                ] * iterations

    fake_kernel_times.fold_fractions = []
    n_steps = 2 * L                                    # two slot sets
    monkeypatch.setattr(kernels, "kernel_times", fake_kernel_times)
    r = kernels.bench(fam, "tiny", 8, L=L, ring="float32", iterations=1, min_pool_bytes=1)
    assert (r["nonfold_us"], r["fold_us"]) == (1.0, 10.0)
    assert r["amortised_us"] == pytest.approx(1 + 9 / L)
    assert r["staggered_us"] == pytest.approx(1 + 9 / L)
    staggered, cycling = fake_kernel_times.fold_fractions
    assert set(cycling) == {0.0, 1.0}
    assert any(0 < f < 1 for f in staggered)
    assert r["standard_us"] == 2.0 and r["wrapper_us"] == 0.0
    assert (r["std_bytes"], r["rep_bytes"]) == fam.min_bytes(dims, L, 4)


@pytest.mark.parametrize("slots_us", [0.0, 1.5])
def test_bench_counts_the_replay_wrappers_xla_ops(monkeypatch, slots_us):
    """A replay step that launches an XLA op (0.7 us) before its kernel (1 us) costs both: the
    op is in the replay times (less the first step's, cut with the set-up copies). The bench's
    own launches are in neither kernel's time: the ring counts' update (0.5 us, timed alone)
    and the step's slot set (`slots_us`, launched by the standard loop too)."""
    fam = FAMILIES["mamba2"]()
    fam.shapes["tiny"] = dict(H=2, P=16, N=16, G=1)
    n_steps = 8
    slot_set = [("dynamic_slice_fusion", slots_us)] if slots_us else []

    def fake_kernel_times(fn, *args, iterations):
        if counts_loop(args):                 # (its set-up copy of S counts: negligible)
            return [[("loop_fusion", 0.5)] * n_steps] * iterations
        if hasattr(args[0], "checkpoint"):
            step = [("gemm_fusion", 0.7), ("replay_decode", 1.0), ("loop_fusion", 0.5)]
        else:
            step = [("standard_decode", 2.0)]
        return [[("copy", 9.0)] + (slot_set + step) * n_steps] * iterations  # set-up copy first

    monkeypatch.setattr(kernels, "kernel_times", fake_kernel_times)
    r = kernels.bench(fam, "tiny", 2, L=4, ring="float32", iterations=1, min_pool_bytes=1)
    wrapper = 0.7 * (n_steps - 1) / n_steps
    assert r["wrapper_us"] == pytest.approx(wrapper)
    for key in ("staggered_us", "amortised_us", "nonfold_us", "fold_us"):
        assert r[key] == pytest.approx(1.0 + wrapper), key
    assert r["standard_us"] == 2.0
    assert r["bench_us"] == pytest.approx(0.5 + slots_us * (n_steps - 1) / n_steps)


@pytest.mark.parametrize("P,std_block,rep_block", [(80, 32, 128), (64, 32, 64)])
def test_bench_times_the_tilings_the_models_run(monkeypatch, P, std_block, rep_block):
    """The table times what tiling=None runs at the shape: at P = 80 the masked-tile defaults
    (not the P = 64 ones, five tiles of 16), an override replacing fields of those."""
    seen = {}

    def record(kind):
        def kernel(st, *args, **kw):
            seen.setdefault(kind, []).append(kw["tiling"])
            return st
        return kernel

    fam = dataclasses.replace(FAMILIES["mamba2"](), standard=record("standard"),
                              replay=record("replay"))
    fam.shapes["tiny"] = dict(H=2, P=P, N=16, G=1)

    def fake_kernel_times(fn, *args, iterations):
        jax.eval_shape(fn, *args)
        return [[("standard_decode", 1.0), ("replay_decode", 1.0)] * 8] * iterations

    monkeypatch.setattr(kernels, "kernel_times", fake_kernel_times)
    kernels.bench(fam, "tiny", 2, L=4, ring="float32", iterations=1, min_pool_bytes=1,
                  rep_kw={"num_stages": 3})
    std, rep = seen["standard"][0], seen["replay"][0]
    assert (std.block_p, std.p_tiles == "masked") == (std_block, P == 80)
    assert (rep.block_p, rep.p_tiles == "masked", rep.num_stages) == (rep_block, P == 80, 3)


@pytest.mark.parametrize("family,dims", [("mamba2", dict(H=2, P=16, N=16, G=1)),
                                         ("gdn", dict(Hk=1, Hv=2, K=16, V=16))])
def test_bench_times_a_bf16_state(monkeypatch, family, dims):
    """--state-dtype bfloat16: the kernels get a bf16 checkpoint (standard state and replay
    buffers) and the byte model counts 2-byte state."""
    fam = FAMILIES[family]()
    fam.shapes["tiny"] = dims
    dtypes = []

    def fake_kernel_times(fn, *args, iterations):
        if counts_loop(args):
            return [[("loop_fusion", 0.5)] * 8] * iterations
        state = args[0] if not hasattr(args[0], "checkpoint") else args[0].checkpoint
        dtypes.append(state.dtype)
        jax.block_until_ready(fn(*args))
        name = "replay" if hasattr(args[0], "checkpoint") else "standard"
        return [[(name, 1.0)] * 8] * iterations

    monkeypatch.setattr(kernels, "kernel_times", fake_kernel_times)
    r = kernels.bench(fam, "tiny", 2, L=4, ring="float32", iterations=1, min_pool_bytes=1,
                      state="bfloat16")
    assert dtypes and all(d == jnp.bfloat16 for d in dtypes)
    assert (r["std_bytes"], r["rep_bytes"]) == fam.min_bytes(dims, 4, 4, 2)
    assert r["std_bytes"] < fam.min_bytes(dims, 4, 4)[0]


def test_bench_refuses_a_wrong_launch_count(monkeypatch):
    fam = FAMILIES["mamba2"]()
    fam.shapes["tiny"] = dict(H=2, P=16, N=16, G=1)
    monkeypatch.setattr(kernels, "kernel_times", lambda fn, *a, iterations: [[("standard", 1.0)]])
    with pytest.raises(RuntimeError, match="expected 8 standard launches, got"):
        kernels.bench(fam, "tiny", 2, L=4, iterations=1, min_pool_bytes=1)


def test_step_time_starts_at_the_first_kernel_of_interest():
    times = [[("copy", 100.0)] + [("replay_verify_k", 2.0), ("scatter", 1.0)] * 2]
    (kept,) = timing.from_first(times, "replay_verify")
    assert sum(us for _, us in kept) == 6.0
    with pytest.raises(RuntimeError, match="no kernel named like 'standard'"):
        timing.from_first(times, "standard")


@pytest.mark.parametrize("family,dims,impl", [
    ("mamba2", dict(H=2, P=16, N=16, G=1), "pallas"),
    ("gdn", dict(Hk=1, Hv=2, K=16, V=16), "pallas"),
    ("mamba2", dict(H=1, P=64, N=16, G=1), "pallas_mosaic_gpu"),
    ("gdn", dict(Hk=1, Hv=1, K=16, V=64), "pallas_mosaic_gpu")])
def test_verify_bench_runs_on_cpu_and_sizes_memory_per_sequence(monkeypatch, family, dims, impl):
    """The verify and baseline loops run (interpret mode); memory per sequence is one state plus
    an L-entry ring (measured on the real buffers) against T + 1 states."""
    fam = FAMILIES[family]()
    fam.shapes["tiny"] = dims

    def fake_kernel_times(fn, *args, iterations):
        jax.block_until_ready(fn(*args))
        return [[("copy", 50.0), ("replay_verify", 2.0), ("standard_verify", 3.0)]]

    monkeypatch.setattr(verify, "kernel_times", fake_kernel_times)
    L, T = 4, 2
    v = verify.bench_verify(fam, "tiny", 2, T, L=L, ring="float32", iterations=1,
                            min_pool_bytes=1, steps_per_set=2, impl=impl)
    assert v["impl"] == impl
    state = fam.state_bytes(dims)
    assert v["replay_mem_per_seq"] == state + L * fam.entry_bytes(dims, 4)
    assert v["baseline_mem_per_seq"] == (1 + T) * state


@pytest.mark.parametrize("family,dims", [("mamba2", dict(H=2, P=16, N=16, G=1)),
                                          ("gdn", dict(Hk=1, Hv=2, K=16, V=16))])
def test_verify_split_holds_counts_at_no_fold_and_every_fold(monkeypatch, family, dims):
    """--split times the verify with counts held at the non-fold steps' mean count (no row
    writes its checkpoint) and at the fold steps' (every live row does), and prints both beside
    their mix at the commit rule's rate."""
    fam = FAMILIES[family]()
    fam.shapes["tiny"] = dims
    runs = []

    def fake_kernel_times(fn, *args, iterations):
        runs.append((args, jax.block_until_ready(fn(*args))))
        return [[("copy", 50.0), ("replay_verify", 2.0), ("standard_verify", 3.0)]]

    monkeypatch.setattr(verify, "kernel_times", fake_kernel_times)
    L, T = 4, 2
    v = verify.bench_verify(fam, "tiny", 2, T, L=L, ring="float32", iterations=1,
                            min_pool_bytes=1, steps_per_set=2, split=True)
    held = [(a, out) for a, out in runs if hasattr(out, "checkpoint")]     # bufs, not a pair
    nonfold, fold = verify.held_counts(T, L)
    assert [int(a[1][0]) for a, _ in held] == [nonfold, fold]
    assert 0 < nonfold < L - T <= fold < L      # a walk in both, a fold in the second only
    for (bufs, counts), out in held:
        moved = np.asarray(jnp.any(out.checkpoint != bufs.checkpoint, axis=tuple(
            range(1, bufs.checkpoint.ndim))))
        assert moved.any() == (int(counts[0]) == fold)
    assert v["fold_rate"] == verify.fold_statistics(T, L)[0]
    assert "non-fold" in verify.line(v, 1.0) and "folds" in verify.line(v, 1.0)


def test_verify_byte_model_reduces_to_decode_at_one_token():
    """With T = 1 every step accepts one token: the ring folds once per L steps holding (L - 1) / 2
    entries on average, exactly the decode byte model; more tokens per step fold more often."""
    assert verify.fold_statistics(1, 16) == pytest.approx((1 / 16, 7.5), rel=1e-3)
    assert verify.held_counts(1, 16) == (7, 15)     # decode: counts 0..14, then the fold at 15
    fam = FAMILIES["mamba2"]()
    dims = fam.shapes["nemotron-h-8b"]
    rep, base = verify.min_bytes(fam, dims, 1, 16, 2)
    assert (base, rep) == pytest.approx(fam.min_bytes(dims, 16, 2), rel=1e-3)
    rate4, _ = verify.fold_statistics(4, 16)
    assert 1 / 16 < rate4 < 2.5 / (16 - 3)     # 2.5 tokens per step, >= L - T + 1 per fold
    rep4, base4 = verify.min_bytes(fam, dims, 4, 16, 2)
    assert base4 / rep4 > 3                      # the 3x target is reachable in bytes


@pytest.mark.parametrize("module,argv,msg", [
    (kernels, ["--batches", "0"], "argument --batches: must be >= 1, got 0"),
    (kernels, ["--window", "12"], "argument --window: must be a power of two in [1, 64], got 12"),
    (kernels, ["--family", "gdn", "--shapes", "nemotron-h-8b"], "argument --shapes: unknown"),
    (kernels, ["--tune", "[1, 2]"], "argument --tune: must be a non-empty JSON list of objects"),
    (kernels, ["--std-config", "{bad"], "argument --std-config: not valid JSON"),
    (verify, ["--tokens", "8", "--window", "4"], "argument --tokens: T = [8] exceeds --window"),
])
def test_bad_arguments_are_one_line_exit_2(module, argv, msg, capsys):
    with pytest.raises(SystemExit) as e:
        module.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and msg in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("module", [kernels, verify])
def test_without_a_gpu_the_kernel_benches_say_so_in_one_line(module, capsys):
    assert module.main(["--batches", "1"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"{module.PROG}: error: needs a CUDA GPU (jax.default_backend() is 'cpu')"


def test_a_shape_an_impl_does_not_take_is_a_row_and_the_rest_still_runs(monkeypatch, capsys,
                                                                          tmp_path):
    """An impl that refuses a shape (here Mosaic GPU, made to refuse Nemotron-Nano-9B-v2's): that
    impl's row says why, every other (impl, shape) is timed, and --json keeps both."""
    monkeypatch.setattr(kernels.cli, "require_gpu", lambda: None)
    monkeypatch.setattr(kernels, "copy_bandwidth", lambda: 4e12)
    timed = []

    def fake_bench(fam, shape, batch, *, impl, **kw):
        if impl == "pallas_mosaic_gpu" and shape == "nemotron-nano-9b-v2":
            raise ValueError("pallas_mosaic_gpu needs d_state N <= 256, got N = 512")
        timed.append((impl, shape))
        return dict(standard_us=2.0, staggered_us=1.0, amortised_us=1.0, nonfold_us=1.0,
                    fold_us=1.0, std_bytes=1e6, rep_bytes=5e5)

    monkeypatch.setattr(kernels, "bench", fake_bench)
    out = tmp_path / "rows.json"
    assert kernels.main(["--family", "mamba2", "--shapes", "nemotron-nano-9b-v2", "nemotron-h-8b",
                         "--batches", "1", "--impls", "pallas", "pallas_mosaic_gpu",
                         "--json", str(out)]) == 0
    assert timed == [("pallas", "nemotron-nano-9b-v2"), ("pallas", "nemotron-h-8b"),
                     ("pallas_mosaic_gpu", "nemotron-h-8b")]
    lines = capsys.readouterr().out.splitlines()
    assert any("| pallas_mosaic_gpu | nemotron-nano-9b-v2 | 1 | not taken: pallas_mosaic_gpu "
               "needs d_state N <= 256" in line for line in lines)
    rows = json.loads(out.read_text())
    assert len(rows) == 4 and sum("error" in r for r in rows) == 1


def test_a_verify_row_out_of_memory_is_a_row_and_the_rest_still_runs(monkeypatch, capsys,
                                                                       tmp_path):
    """The baseline's 1 + T states per row may not fit (the ninth session: Nemotron-Nano-9B-v2
    at T = 8, batch 256): that row says so in one line, the other rows run, --json keeps all;
    any other error still ends the run."""
    monkeypatch.setattr(verify.cli, "require_gpu", lambda: None)
    monkeypatch.setattr(verify, "copy_bandwidth", lambda: 4e12)
    timed = []

    def fake_bench_verify(fam, shape, batch, T, *, impl, **kw):
        if T == 8:
            raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
                               "22.50GiB")
        timed.append((shape, T))
        return dict(family=fam.name, impl=impl, shape=shape, batch=batch, T=T, replay_us=1.0,
                    baseline_us=2.0, speedup=2.0, replay_mem_per_seq=1e6,
                    baseline_mem_per_seq=5e6, replay_bytes_per_row=1e6,
                    baseline_bytes_per_row=4e6, replay_gbs=1.0, baseline_gbs=1.0)

    monkeypatch.setattr(verify, "bench_verify", fake_bench_verify)
    out = tmp_path / "rows.json"
    argv = ["--shapes", "nemotron-h-8b", "--tokens", "4", "8", "2", "--batches", "256",
            "--json", str(out)]
    assert verify.main(argv) == 0
    assert timed == [("nemotron-h-8b", 4), ("nemotron-h-8b", 2)]
    assert any(line.startswith("| nemotron-h-8b | 256 | 8 | out of memory: RESOURCE_EXHAUSTED")
               for line in capsys.readouterr().out.splitlines())
    rows = json.loads(out.read_text())
    assert [r["T"] for r in rows] == [4, 8, 2] and sum("error" in r for r in rows) == 1

    def broken(*a, **kw):
        raise RuntimeError("a kernel bug")
    monkeypatch.setattr(verify, "bench_verify", broken)
    assert verify.main(argv) == 1
    assert "RuntimeError: a kernel bug" in capsys.readouterr().err
