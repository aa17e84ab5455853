"""`replayjax bench serve` against the test server (`demo_server`): a closed-loop run prints its
table; --compare over an open-loop sweep writes the markdown table and the PNG plot; a trace
works; bad input is one line; failures are counted, not raised."""

import json

import pytest

from replayjax.bench import serve

COMMON = ["--num-requests", "8", "--prompt-len", "8", "--max-tokens", "8", "--workload", "sync"]


def test_closed_loop_table(demo_server, capsys):
    assert serve.main(["--url", f"{demo_server.url}/v1", "--concurrency", "4", *COMMON]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| server | load | requests | failed | req/s | out tok/s | TTFT")
    cells = [c.strip() for c in out[2].split("|")[1:-1]]
    assert cells[:4] == [f"{demo_server.url}/v1", "concurrency=4", "8", "0"]
    assert float(cells[5]) > 0 and len(out) == 3


def test_compare_writes_plot_and_table(demo_server, tmp_path, capsys):
    """--compare runs both servers at every point; --num-requests per point (6, then 8)."""
    png, md = tmp_path / "cmp.png", tmp_path / "cmp.md"
    assert serve.main(["--compare", demo_server.url, demo_server.url, "--labels", "a", "b",
                       "--rate", "20", "200", *COMMON, "--num-requests", "6", "8", "--json",
                       "--plot", str(png), "--markdown", str(md)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["server"], r["load"], r["requests"]) for r in rows] == [
        ("a", "rate=20", 6), ("b", "rate=20", 6), ("a", "rate=200", 8), ("b", "rate=200", 8)]
    for r in rows:
        assert r["failed"] == 0 and r["output_tokens_per_s"] > 0
        assert 0 < r["ttft_ms_p50"] <= r["ttft_ms_p90"] <= r["ttft_ms_p99"]
        assert 0 < r["itl_ms_p50"] and 0 < r["latency_s_p50"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(md.read_text().splitlines()) == 2 + 4


def test_trace_and_failures(demo_server, tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"prompt": "This program", "max_new_tokens": 4}\n'
                     '{"prompt_ids": [84, 104], "max_new_tokens": 4, "temperature": 0.5}\n'
                     '{"prompt_ids": [300], "max_new_tokens": 4}\n')        # out of vocabulary
    assert serve.main(["--url", demo_server.url, "--concurrency", "2", "--trace", str(trace),
                       "--json"]) == 0
    out = capsys.readouterr()
    [row] = json.loads(out.out)
    assert (row["requests"], row["failed"]) == (3, 1)
    assert "HTTP 400" in row["first_error"] and "outside the vocabulary" in out.err


@pytest.mark.parametrize("argv,msg", [
    (["--concurrency", "2"], "one of the arguments --url --compare is required"),
    (["--url", "http://127.0.0.1:9", "--rate", "0"], "must be a number > 0"),
    (["--url", "http://127.0.0.1:9", "--rate", "1", "--concurrency", "1"], "not allowed with"),
    (["--url", "http://127.0.0.1:9", "--concurrency", "1"], "cannot list its models"),
    (["--url", "http://127.0.0.1:9", "--concurrency", "1", "--labels", "a", "b"],
     "--labels names the two --compare servers"),
    (["--url", "http://127.0.0.1:9", "--concurrency", "1", "--trace", "/nonexistent"],
     "--trace /nonexistent: no such file"),
    (["--url", "http://127.0.0.1:9", "--concurrency", "1", "2", "--num-requests", "1", "2", "3"],
     "--num-requests: give one number or one per --concurrency value (2), got 3"),
])
def test_bad_input_is_one_line(argv, msg, capsys):
    try:
        code = serve.main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code in (1, 2) and msg in err and len(err.strip().splitlines()) == 1, err
