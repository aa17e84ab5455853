import json

import jax
import jax.numpy as jnp
import pytest

from replayjax.bench import profile, roofline, trace
from replayjax.loading import load_model

NEMOTRON = "tests/fixtures/hf/nemotron_h"


def test_profile_names_the_decode_kernels_by_class(capsys, tmp_path):
    """A decode step of the tiny Nemotron-H (Mamba-2, attention, MLP, MoE) on CPU: every class
    the step runs shows up, classed from the HLO of the traced module, with its roofline (at a
    --peak-tflops so low that every class doing FLOPs is flops-bound)."""
    assert profile.main(["--model", NEMOTRON, "--batch", "2", "--prompt-len", "6", "--steps",
                         "3", "--window", "4", "--trace-dir", str(tmp_path), "--top", "1000",
                         "--peak-tflops", "1e-6", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(tmp_path.rglob("*.xplane.pb")) and out["steps"] == 3
    seen = {k["cls"] for k in out["kernels"]}
    assert {"ssm", "gemm", "attention", "moe", "sampling"} <= seen
    assert all(k["count"] > 0 and k["total_us"] > 0 for k in out["kernels"])
    # each kernel says which line of ours it comes from: the SSM mixer's, the MoE's
    sources = {k["source"].split(":")[0] for k in out["kernels"] if k["by"] == "hlo"}
    assert {"models/nemotron_h.py", "models/moe.py"} & sources, sources
    # CPU: the step's thunks name their instructions (a stray thunk of another computation
    # traced alongside may not)
    by_hlo = sum(k["total_us"] for k in out["kernels"] if k["by"] == "hlo")
    assert by_hlo > 0.9 * sum(k["total_us"] for k in out["kernels"]), [
        k["name"] for k in out["kernels"] if k["by"] != "hlo"]
    classes = {c["cls"]: c for c in out["classes"]}
    for c in ("ssm", "gemm", "attention", "moe"):
        assert classes[c]["min_mb"] > 0 and classes[c]["measured_us"] > 0
    assert classes["total"]["measured_us"] == pytest.approx(
        sum(k["total_us"] for k in out["kernels"]) / 3)
    assert classes["total"]["min_mb"] == pytest.approx(
        sum(c["min_mb"] for n, c in classes.items() if n != "total"))
    assert out["copy_gbs"] > 0 and out["compile_s"] > 0
    # FLOPs at 3 steps from a 6-token prompt: KV lengths 6, 7, 8, i.e. 7 on average
    flops = roofline.decode_step_flops(load_model(NEMOTRON), 2, 7, mode="replay", window=4,
                                       state_dtype=jnp.float32)
    assert out["peak_tflops"] == 1e-6
    for c, f in flops.items():
        r = classes[c]
        assert r["min_gflop"] == pytest.approx(f / 1e9) and r["flops_us"] == pytest.approx(f)
        assert r["ideal_us"] == max(r["bytes_us"], r["flops_us"])
        assert r["bound"] == ("flops" if f else "bytes")
    assert classes["total"]["ideal_us"] == pytest.approx(
        sum(c["ideal_us"] for n, c in classes.items() if n != "total"))


def test_profile_traces_speculative_verify_steps(capsys, tmp_path):
    """--drafter: exactly --steps verify steps are traced (one a visit; the rest drain untraced),
    by class, with no roofline modelled for them; a drafter the model lacks is one line."""
    assert profile.main(["--model", NEMOTRON, "--batch", "2", "--prompt-len", "6", "--steps",
                         "3", "--window", "4", "--drafter", "ngram", "--num-draft", "2",
                         "--trace-dir", str(tmp_path), "--top", "1000", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kind"] == "verify" and out["steps"] == 3
    classes = {c["cls"]: c for c in out["classes"]}
    assert classes["ssm"]["measured_us"] > 0 and classes["gemm"]["measured_us"] > 0
    assert all(c["min_mb"] is None and c["of_roofline"] is None for c in classes.values())
    assert classes["total"]["measured_us"] == pytest.approx(
        sum(k["total_us"] for k in out["kernels"]) / 3)
    assert profile.main(["--model", NEMOTRON, "--drafter", "mtp"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("replayjax profile: error: --drafter mtp: drafter='mtp' needs a model "
                          "with an MTP head") and len(err.strip().splitlines()) == 1


def test_report_says_which_bound_binds_and_when_there_is_no_peak(capsys):
    args = profile.parse_args(["--model", NEMOTRON])
    for peak, note in ((None, "no bf16 peak known (--peak-tflops): ideal from bytes alone"),
                       (2e12, "bf16 peak 2 TFLOP/s")):
        classes = roofline.table({"gemm": 1e6}, 1e9, {"gemm": 4e-3}, 2, {"gemm": 4e9}, peak)
        profile.print_report(args, dict(trace_dir="t", steps=2, compile_s=1.0,
                                        host_ms_per_step=1.0, copy_gbs=1.0, kernels=[],
                                        peak_tflops=peak and peak / 1e12, classes=classes))
        out = capsys.readouterr().out
        assert out.splitlines()[0].endswith(f"copy bandwidth 1 GB/s; {note}")
        ideal = "2000.0 (flops) | 100%" if peak else "1000.0 (bytes) | 50%"
        assert f"| gemm | 2000.0 | 1.00 | 4 | {ideal} |" in out


def cached_attention(x):
    return _inner(x) * 2.0            # the stack through cached_attention: attention


def _inner(x):
    return jnp.tanh(x)


def test_classes_come_from_scopes_stacks_and_opcodes():
    def step(x, w):
        y = x @ w                                         # a dot: gemm
        with jax.named_scope("moe"):
            z = jnp.exp(y)                                # a named scope: moe
        return cached_attention(z), jnp.sin(x)            # sin: other

    text = jax.jit(step).lower(jnp.ones((4, 8)), jnp.ones((8, 8))).compile().as_text()
    classes = trace.classify_module(text)
    by_op = {}
    for name, cls in classes.items():
        by_op.setdefault(name.split(".")[0], set()).add(cls)
    assert by_op["exp"] == {"moe"}
    assert by_op["tanh"] == {"attention"}                 # found through the parent frame
    assert by_op["sin"] == {"other"}
    assert "gemm" in {c for n, c in classes.items() if n.startswith(("dot", "ynn"))}
    fusions = {c for n, c in classes.items() if "fusion" in n}
    assert "attention" in fusions                         # a fusion takes its strongest class


@pytest.mark.parametrize("opcode,op_name,frames,target,cls", [
    ("add", "jit(f)/ssm/add", [], "", "ssm"),
    ("dot", "jit(f)/ssm/gemm/dot_general", [], "", "gemm"),         # the innermost scope
    ("fusion", "jit(f)/sampling", [], "", "sampling"),
    ("reduce", "jit(f)/reduce", [("/x/replayjax/sampling.py", "sample")], "", "sampling"),
    ("dot", "jit(f)/dot_general", [("/x/models/common.py", "Linear.__call__"),
                                   ("/x/models/qwen.py", "MoE.__call__")], "", "moe"),
    ("custom-call", "jit(f)/dot_general", [], "__cublas$gemm", "gemm"),
    ("dot", "jit(f)/dot_general", [("/x/models/common.py", "Linear.__call__"),
                                   ("/x/models/nemotron_h.py", "Mamba2Mixer.decode")], "", "gemm"),
    ("custom-call", "jit(f)/pallas_call", [("/x/pallas_kernels/mamba2/api.py", "replay_decode")],
     "__gpu$xla.gpu.triton", "ssm"),
    ("multiply", "jit(f)/mul", [("/x/models/qwen.py", "GatedDeltaNet._split")], "", "ssm"),
    ("add", "jit(f)/add", [("/x/models/common.py", "rms_norm")], "", "other"),
    ("all-reduce-start", "jit(f)/ssm/psum", [("/x/models/parallel.py", "tp_sum")], "",
     "collective"),                                                 # whatever its scope
])
def test_instruction_class(opcode, op_name, frames, target, cls):
    assert trace.instruction_class(opcode, op_name, frames, target) == cls


@pytest.mark.parametrize("name,op_name,cls", [
    ("fusion_12", "jit(_decode_loop)/while/body/moe/dot_general", "moe"),
    ("mamba2_replay_decode", "", "ssm"),
    ("moe_gate_up", "", "moe"),                  # the MoE Pallas kernels (H200: were "other")
    ("decode_attention", "", "attention"),       # the Pallas decode attention (H200: "other")
    ("conv_update", "", "conv"),                 # the Pallas decode conv: the ssm class's bytes
    ("nvjet_sm90_tss_128x136", "jit(f)", "gemm"),
    ("loop_add_fusion", "jit(f)/add", "other"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "", "collective"),
])
def test_kernels_without_hlo_fall_back_to_scope_then_name(name, op_name, cls):
    ev = trace.Event(name, 1.0, "jit_missing", 7, "op.1", op_name)
    assert trace._fallback_class(ev) == cls


def test_sources_name_our_innermost_frame_and_the_op():
    def step(x):
        return jnp.tanh(x) * 2.0

    text = jax.jit(step).lower(jnp.ones((8,))).compile().as_text()
    line = step.__code__.co_firstlineno + 1
    assert f"tests/replayjax/bench/test_profile.py:{line} " \
        "test_sources_name_our_innermost_frame_and_the_op.<locals>.step (mul)" in \
        trace.module_sources(text).values()


def test_profiled_programs_name_their_own_checkout_not_the_cached_one(tmp_path):
    """The persistent compilation cache ignores metadata: the same program from a second checkout
    is loaded with the first one's file names, except under `fresh_metadata` (which profiling
    uses). The flag is restored on leaving it."""
    def compiled(path):
        ns = {"jnp": jnp}
        exec(compile("def f(x):\n    return jnp.sin(x) * 3\n", path, "exec"), ns)
        return jax.jit(ns["f"]).lower(jnp.ones((4,))).compile().as_text()

    flags = dict(jax_compilation_cache_dir=str(tmp_path),
                 jax_persistent_cache_min_compile_time_secs=0,
                 jax_persistent_cache_min_entry_size_bytes=0)
    before = {k: getattr(jax.config, k) for k in flags}
    try:
        for k, v in flags.items():
            jax.config.update(k, v)
        compiled("/first/checkout/m.py")
        assert "/first/" in compiled("/second/checkout/m.py")       # stale: what it guards
        with trace.fresh_metadata():
            text = compiled("/third/checkout/m.py")
        assert "/third/" in text and "/first/" not in text
    finally:
        for k, v in before.items():
            jax.config.update(k, v)
    assert not jax.config.jax_compilation_cache_include_metadata_in_key


def test_kernels_of_a_cuda_graph_are_found_by_their_kernel_name(monkeypatch):
    """A kernel launched in a CUDA graph carries no instruction: it is matched by the kernel
    name XLA gives its instruction (fusion.12 -> fusion_12), in its module or the largest; a
    Pallas kernel's name matches none and falls back to its name."""
    def step(x, w):
        with jax.named_scope("moe"):
            return jnp.exp(x @ w) + 1.0

    text = jax.jit(step).lower(jnp.ones((4, 8)), jnp.ones((8, 8))).compile().as_text()
    moe = next(i for i, c in trace.classify_module(text).items() if c == "moe" and "." in i)
    small = jax.jit(jnp.sin).lower(jnp.ones(3)).compile().as_text()
    monkeypatch.setattr(trace, "xplane_file", lambda d: d)
    monkeypatch.setattr(trace, "hlo_modules", lambda p: {"jit_step(1)": text, "jit_sin(2)": small})
    monkeypatch.setattr(trace, "device_events", lambda p: [
        trace.Event(trace.kernel_name(moe), 5.0, None, None, None),
        trace.Event("mamba2_replay_decode", 3.0, None, None, None)])
    rows = {r["name"]: r for r in trace.kernel_table("t")}
    hit = rows[trace.kernel_name(moe)]
    assert (hit["cls"], hit["by"]) == ("moe", "kernel") and "test_profile.py" in hit["source"]
    miss = rows["mamba2_replay_decode"]
    assert (miss["cls"], miss["by"], miss["source"]) == ("ssm", "name", "")


def test_only_the_modules_that_ran_are_read(monkeypatch):
    """A trace's metadata holds every module the process compiled (thousands in a long-lived
    one): the table reads the modules its events name, those of its id first, and no other
    when their instructions are found."""
    def step(x):
        return jnp.exp(x) + 1.0

    text = jax.jit(step).lower(jnp.ones(4)).compile().as_text()
    op = next(iter(trace.classify_module(text)))
    read = []

    class Texts(dict):
        def __getitem__(self, key):
            read.append(key)
            return super().__getitem__(key)

    others = {f"jit_other({i})": "not HLO: never read" for i in range(50)}
    monkeypatch.setattr(trace, "xplane_file", lambda d: d)
    monkeypatch.setattr(trace, "hlo_modules", lambda p: Texts(
        {**others, "jit_step(3)": "not HLO either", "jit_step(7)": text}))
    monkeypatch.setattr(trace, "device_events", lambda p: [
        trace.Event(op, 2.0, "jit_step", 7, op), trace.Event(op, 1.0, "jit_step", 7, op)])
    (row,) = trace.kernel_table("t")
    assert (row["count"], row["by"]) == (2, "hlo")
    assert set(read) == {"jit_step(7)"}


def test_module_texts_answer_membership_without_printing():
    """`key in hlo_modules(...)` (a lookup per kernel event) must not print the module: a
    profile's few hundred events took 34 ms each that way (the protos here are not HLO, so
    printing one fails)."""
    texts = trace._HloTexts({"jit_step(1)": b"not a proto", "jit_sin(2)": b"nor this"})
    assert "jit_step(1)" in texts and "jit_step(9)" not in texts
    assert sorted(texts) == ["jit_sin(2)", "jit_step(1)"] and len(texts) == 2


def test_nested_thunks_keep_the_innermost():
    evs = [(0, 10, "while", {}), (1, 4, "body1", {}), (5, 9, "body2", {}), (12, 13, "after", {})]
    assert [e[2] for e in trace._innermost(evs)] == ["body1", "body2", "after"]


@pytest.mark.parametrize("argv,msg", [
    (["--steps", "0"], "argument --steps: must be >= 1, got 0"),
    (["--batch", "0"], "argument --batch: must be >= 1, got 0"),
    (["--window", "10"], "argument --window: must be a power of two in [1, 64], got 10"),
    (["--peak-tflops", "0"], "argument --peak-tflops: must be a finite number > 0, got 0"),
    (["--peak-tflops", "-1"], "argument --peak-tflops: must be a finite number > 0, got -1"),
    (["--peak-tflops", "nan"], "argument --peak-tflops: must be a finite number > 0, got nan"),
    (["--drafter", "ngram", "--num-draft", "16"], "argument --num-draft: must be < --window = 16"),
    (["--drafter", "eagle"], "argument --drafter: invalid choice: 'eagle'"),
    (["--num-draft", "2"], "argument --num-draft: needs --drafter (ngram or mtp)"),
])
def test_bad_arguments_are_one_line_exit_2(argv, msg, capsys):
    with pytest.raises(SystemExit) as e:
        profile.main(["--model", "tests/fixtures/hf/nemotron_h"] + argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and msg in err and len(err.strip().splitlines()) == 1


def test_missing_model_is_one_line(capsys):
    assert profile.main(["--model", "no/such/dir"]) == 1
    assert capsys.readouterr().err == "replayjax profile: error: --model: model directory " \
                                      "'no/such/dir' does not exist\n"


def test_sources_say_what_an_instruction_xla_made_computes():
    """An instruction carrying no op_name and no frame (XLA made it, as the dot merger's
    concatenation of the q / k / v weights) is named by its fused root's opcode and its shape."""
    text = """HloModule m

%wrapped_concatenate_computation (p0: bf16[4,4], p1: bf16[4,2]) -> bf16[4,6] {
  %p0 = bf16[4,4]{1,0} parameter(0)
  %p1 = bf16[4,2]{1,0} parameter(1)
  ROOT %concatenate.1 = bf16[4,6]{1,0} concatenate(%p0, %p1), dimensions={1}
}

ENTRY %main (a: bf16[4,4], b: bf16[4,2]) -> bf16[4,6] {
  %a = bf16[4,4]{1,0} parameter(0)
  %b = bf16[4,2]{1,0} parameter(1)
  ROOT %wrapped_concatenate = bf16[4,6]{1,0} fusion(%a, %b), kind=kLoop, calls=%FUSED
}
""".replace("%FUSED", "%wrapped_concatenate_computation, "
            'metadata={scheduling_name="wrapped_concatenate"}')
    sources = trace.module_sources(text)
    assert sources["wrapped_concatenate"] == "XLA concatenate bf16[4,6]"
    assert sources["concatenate.1"] == "XLA concatenate bf16[4,6]"
