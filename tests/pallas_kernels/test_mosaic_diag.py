"""scripts/mosaic_diag.py through the Mosaic GPU interpreter: each case in its own process, one
markdown row per case (OK with the relative error against XLA, or the error's last line)."""

import json
import subprocess
import sys


def test_diag_rows_name_each_case_and_its_result(tmp_path):
    out = tmp_path / "diag.json"
    cmd = [sys.executable, "scripts/mosaic_diag.py", "--interpret", "--families", "mamba2",
           "--kernels", "replay_decode", "--shapes", "unit", "--blocks", "16", "48",
           "--stages", "2", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("| family | kernel | shape | tiling | result | seconds |")
    assert len(lines) == 4                                   # header, rule, two cases
    ok, bad = json.loads(out.read_text())
    assert (ok["family"], ok["kernel"], ok["shape"], ok["block"], ok["stages"]) == (
        "mamba2", "replay_decode", "unit", 16, 2)
    assert ok["result"].startswith("OK ") and float(ok["result"][3:]) < 1e-4   # a fold step
    assert bad["result"] == "ERROR: ValueError: block_n = 48 must be a power of two"
    assert "Traceback" not in proc.stdout
    assert lines[2:] == [
        f"| mamba2 | replay_decode | unit | block {r['block']}, stages 2 | {r['result']} | "
        f"{r['seconds']} |" for r in (ok, bad)]
