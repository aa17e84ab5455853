import json

from replayjax import profile_cli


def test_profile_writes_a_trace_and_a_table(capsys, tmp_path):
    profile_cli.main(["--model", "tests/fixtures/hf/nemotron_h", "--batch", "2", "--prompt-len",
                      "6", "--steps", "3", "--window", "4", "--trace-dir", str(tmp_path), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert list(tmp_path.rglob("*.xplane.pb")) and out["kernels"]
    assert all(k["count"] > 0 and k["total_us"] >= 0 for k in out["kernels"])
