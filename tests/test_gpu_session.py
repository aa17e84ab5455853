"""`scripts/gpu_session.sh` dry-run on the CPU: every stage's commands are recorded by stand-ins
for `python3` and `ncu`, then each command's arguments are parsed by the program they call (its
own argparse, stopped right after parsing), and the test files and ids it names are checked to
exist. A flag renamed or a test moved fails here, not minutes into a GPU session."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from replayjax.commandline import UserError

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_session.sh"

# A command-line stand-in: records its arguments as one JSON line and prints a table row (the
# stages grep their output for "^|" under `set -o pipefail`).
_RECORDER = """#!/bin/sh
exec {python} -c 'import json, sys; open(sys.argv[1], "a").write(json.dumps(sys.argv[2:]) + "\\n")
print("| dry run |")' "{log}" {name} "$@"
"""


def stages() -> list[str]:
    """The stage names of the script's `case` (alternatives split)."""
    text = SCRIPT.read_text()
    return [s for m in re.finditer(r"^  ([a-z0-9|-]+)\)", text, re.M) for s in m[1].split("|")]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """{stage: (exit code, stderr, [argv of each python3 / ncu call])} of a dry run of every
    stage."""
    tmp = tmp_path_factory.mktemp("gpu_session")
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    out = {}
    for stage in stages():
        log = tmp / f"{stage}.jsonl"
        for name in ("python3", "ncu", "nvidia-smi"):
            exe = bin_dir / name
            exe.write_text(_RECORDER.format(python=sys.executable, log=log, name=name))
            exe.chmod(0o755)
        env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
        env.pop("DEADLINE", None)
        run = subprocess.run(["bash", str(SCRIPT), stage, str(tmp / "out" / stage)], env=env,
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
        calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() \
            else []
        out[stage] = (run.returncode, run.stderr, calls)
    return out


class _Parsed(BaseException):
    """Raised right after a successful parse (a BaseException: no `except Exception` in a
    program's main swallows it)."""


def _parses(main, argv) -> str | None:
    """None if `main(argv)` parses its arguments, else argparse's error text."""
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        original(self, args, namespace)
        raise _Parsed

    argparse.ArgumentParser.parse_args = parse_then_stop
    try:
        main(argv)
    except _Parsed:
        return None
    except SystemExit as e:
        return f"exit {e.code}"
    finally:
        argparse.ArgumentParser.parse_args = original
    return "returned without parsing its arguments"


def _script_main(path: Path):
    spec = importlib.util.spec_from_file_location(f"_dry_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def _test_ids_exist(args) -> list[str]:
    """Problems with the test files and ids a pytest command names."""
    problems = []
    for a in args:
        if not a.startswith("tests/"):
            continue
        path, _, name = a.partition("::")
        if not (ROOT / path).exists():
            problems.append(f"no test file {path}")
        elif name and f"def {name.split('[')[0].split('::')[-1]}(" not in (ROOT / path).read_text():
            problems.append(f"no test {name} in {path}")
    return problems


def _tilings_exist(module_name, argv) -> list[str]:
    """Problems with the tiling sweeps of a benchmark that checks them without a GPU (its
    `check_tilings`): a field its tilings do not have."""
    module = importlib.import_module(module_name)
    if not hasattr(module, "check_tilings"):
        return []
    try:
        module.check_tilings(module.parse_args(argv))
    except UserError as e:
        return [f"{module_name} {' '.join(argv)}: {e}"]
    return []


def check_call(argv) -> list[str]:
    """Problems with one recorded python3 call (argv after `python3`)."""
    if argv[:1] == ["-c"]:
        return []
    if argv[:2] == ["-m", "pytest"]:
        return _test_ids_exist(argv[2:])
    if argv[:1] == ["-m"]:
        main = importlib.import_module(argv[1]).main
        calls = [argv[2:]]
        if argv[1] == "replayjax.cli" and argv[2:3] == ["launch"] and "--" in argv:
            calls.append(argv[argv.index("--") + 1:])      # the launched command too
        problems = [f"{argv[1]} {' '.join(a)}: {err}" for a in calls
                    if (err := _parses(main, a)) is not None]
        return problems or _tilings_exist(argv[1], argv[2:])
    if argv[0].startswith("scripts/"):
        err = _parses(_script_main(ROOT / argv[0]), argv[1:])
        return [] if err is None else [f"{' '.join(argv)}: {err}"]
    if argv[0].startswith(".peer_bench/"):       # the peers' harness, copied in on the GPU side
        return []
    return [f"unrecognised command: python3 {' '.join(argv)}"]


@pytest.mark.parametrize("stage", stages())
def test_stage_commands_parse(stage, recorded):
    code, stderr, calls = recorded[stage]
    assert code == 0, f"stage {stage} exited {code} in a dry run: {stderr[-500:]}"
    python_calls = []
    for tool, *argv in calls:
        if tool == "ncu":           # ncu OPTIONS python3 ARGS: the profiled program
            argv = argv[argv.index("python3") + 1:] if "python3" in argv else []
        if tool != "nvidia-smi" and argv:
            python_calls.append(argv)
    problems = [p for argv in python_calls for p in check_call(argv)]
    assert not problems, "\n".join(problems)


def test_every_stage_runs_something(recorded):
    assert {s for s, (_, _, calls) in recorded.items() if not calls} == set()


@pytest.mark.parametrize("stage,message", [(None, "usage: scripts/gpu_session.sh STAGE"),
                                           ("no-such-stage", "unknown stage no-such-stage")])
def test_a_missing_or_unknown_stage_is_one_line(stage, message, tmp_path):
    argv = ["bash", str(SCRIPT)] + ([] if stage is None else [stage, str(tmp_path / "out")])
    run = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and run.stderr.splitlines() == [run.stderr.strip()]
    assert message in run.stderr
