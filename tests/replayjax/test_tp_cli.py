"""--tp on the command line and several processes: `replayjax launch --nproc 2 --cpu` runs
`generate --tp 2` as two processes joined by jax.distributed (gloo collectives between the CPU
processes) and prints HF's greedy tokens once; bad --tp values are one-line errors."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from replayjax import distributed, generate_cli, launch
from replayjax.bench import e2e

NEMOTRON = "tests/fixtures/hf/nemotron_h"


def _ids(prompt):
    return ",".join(map(str, prompt))


def test_two_processes_generate_the_single_device_tokens():
    ref = np.load(f"{NEMOTRON}/reference.npz")
    prompts = [ref["prompts"][i, :n].tolist() for i, n in enumerate(ref["prompt_lens"][:2])]
    cmd = [sys.executable, "-m", "replayjax.cli", "launch", "--nproc", "2", "--cpu", "--",
           "generate", "--model", NEMOTRON, "--max-new-tokens", "8", "--tp", "2", "--json"]
    for p in prompts:
        cmd += ["--prompt-ids", _ids(p)]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}    # one device each
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1                                   # printed by process 0 only
    results = json.loads(lines[0])["results"]
    assert [r["tokens"] for r in results] == ref["greedy_tokens"][:2, :8].tolist()


def test_launch_refuses_bad_arguments(capsys):
    for argv, msg in ((["--nproc", "0", "--", "generate"], "--nproc: must be >= 1"),
                      (["--nproc", "2"], "give the command to run after --"),
                      (["--nproc", "2", "--", "launch"], "cannot be launch itself"),
                      (["--nproc", "2", "--", "foo"], "unknown command 'foo' (commands: bench, "
                                                      "convert, generate, profile, serve)")):
        with pytest.raises(SystemExit) as e:
            launch.main(argv)
        assert e.value.code == 2 and msg in capsys.readouterr().err


def test_worker_environment():
    env = launch.worker_env({}, coordinator="127.0.0.1:1234", nproc=2, rank=1, cpu=False)
    assert distributed.settings(env) == dict(coordinator_address="127.0.0.1:1234",
                                             num_processes=2, process_id=1,
                                             local_device_ids=[1])
    cpu = launch.worker_env({}, coordinator="h:1", nproc=2, rank=0, cpu=True)
    assert cpu["JAX_PLATFORMS"] == "cpu" and distributed.settings(cpu)["local_device_ids"] is None
    with pytest.raises(distributed.LaunchError, match="REPLAYJAX_PROCESS_ID is not set"):
        distributed.settings({"REPLAYJAX_COORDINATOR": "h:1", "REPLAYJAX_NUM_PROCESSES": "2"})
    with pytest.raises(distributed.LaunchError, match=r"= 2 must be in \[0, 1\]"):
        distributed.settings(dict(env, REPLAYJAX_PROCESS_ID="2"))


def test_tp_errors_are_one_line(capsys):
    n = len(jax.devices())
    assert generate_cli.main(["--prompt-ids", "1,2", "--tp", str(n + 1)]) == 1
    assert capsys.readouterr().err.strip() == (
        f"replayjax generate: error: --tp {n + 1}: tp = {n + 1} exceeds the {n} visible "
        f"CPU device(s)")
    # the demo model: 4 heads, 2 groups
    assert generate_cli.main(["--prompt-ids", "1,2", "--tp", "3"]) == 1
    assert capsys.readouterr().err.strip() == ("replayjax generate: error: --tp 3: tp = 3 does "
                                               "not divide the model's num_attention_heads (4)")
    assert e2e.main(["--synthetic", "nemotron-h-8b", "--tp", "3", "--isolate", "none"]) == 1
    assert capsys.readouterr().err.strip() == ("replayjax bench: error: --synthetic "
                                               "nemotron-h-8b: tp = 3 does not divide the "
                                               "model's num_attention_heads (32)")
    assert e2e.main(["--synthetic", "nemotron-h-8b", "--tp", str(n + 1), "--isolate",
                     "none"]) == 1
    assert f"--tp {n + 1}: tp = {n + 1} exceeds" in capsys.readouterr().err
    assert generate_cli.main(["--prompt-ids", "1,2", "--expert-parallel"]) == 1
    assert capsys.readouterr().err.strip() == (
        "replayjax generate: error: --expert-parallel: needs --tp N > 1 (the experts split "
        "over N devices)")
    assert generate_cli.main(["--model", "tests/fixtures/hf/qwen3_5", "--prompt-ids", "1,2",
                              "--tp", "2", "--expert-parallel"]) == 1   # a dense model
    assert capsys.readouterr().err.strip() == (
        "replayjax generate: error: --tp 2: expert parallelism splits MoE experts; the model "
        "has no MoE layers")


@pytest.mark.parametrize("model,split", [("nemotron_h_p80", []),
                                         ("nemotron_h_latent_moe", ["--expert-parallel"])])
def test_bench_splits_the_model(capsys, model, split):
    """`replayjax bench --tp 2 [--expert-parallel]`: a decode row with its roofline per
    device."""
    assert e2e.main(["--model", f"tests/fixtures/hf/{model}", "--tp", "2", "--batch", "2",
                     "--prompt-len", "6", "--new-tokens", "6", "--window", "4",
                     "--steps-per-visit", "4", "--variants", "replay", "--isolate", "none",
                     "--json", *split]) == 0
    out = json.loads(capsys.readouterr().out)
    row, = out["rows"]
    assert out["config"]["tp"] == 2 and row["failures"] == 0
    assert row["ideal_step_ms"] == pytest.approx(row["min_mb_per_step"] * 1e6 / 2 /
                                                 (row["copy_gbs"] * 1e9) * 1e3)


def test_launch_reports_a_failing_command(capfd):
    assert launch.main(["--nproc", "2", "--cpu", "--", "generate", "--model", "no/such/dir",
                        "--prompt-ids", "1"]) == 1
    assert "model directory 'no/such/dir' does not exist" in capfd.readouterr().err


def test_lm_head_measurement_runs(capsys):
    """scripts/tp_lm_head.py (the replicated vs vocab-parallel LM head measurement for the GPU
    session) runs on a mesh and its three variants pick the same greedy tokens."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("tp_lm_head", "scripts/tp_lm_head.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--tp", "2", "--batches", "3", "--shapes", "nemotron-h-8b", "--scale",
                        "256", "--steps", "2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["variant"] for r in rows] == list(script.variants(2))
    assert all(r["greedy_equal"] and r["us"] > 0 for r in rows)
    assert rows[1]["head_mb"] == rows[0]["head_mb"] / 2


def test_allreduce_measurement_runs_each_setting_in_its_process(capsys):
    """scripts/tp_allreduce.py (which collective implementation a TP step's all-reduces should
    use): each setting in its own process, the sums exact; an unknown XLA flag is a failed row,
    not a crash of the whole measurement."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("tp_allreduce", "scripts/tp_allreduce.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.SETTINGS["bad flag"] = ({}, ["--xla_no_such_flag=true"])
    try:
        assert script.main(["--tp", "2", "--batches", "2", "--hidden", "64", "--count", "4",
                            "--settings", "default", "one-shot", "bad flag", "--json"]) == 0
    finally:
        del script.SETTINGS["bad flag"]
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["setting"] for r in rows] == ["default", "one-shot", "bad flag"], rows
    assert all(r.get("exact") and r["us"] > 0 for r in rows[:2]) and "error" in rows[2], rows
