"""`replayjax bench serve`: a load generator over HTTP against any OpenAI-compatible server
(`replayjax serve`, vLLM, SGLang): streaming /v1/completions requests, open loop (Poisson
arrivals at --rate requests/s) or closed loop (--concurrency clients, each sending its next
request when the last one ends).

Requests: synthetic (seeded; --num-requests prompts of random token ids in [3, --vocab), lengths
log-uniform around --prompt-len with --workload mixed or all equal with sync, --max-tokens each)
or a JSONL trace (--trace, the format of `replayjax bench --trace`; text prompts are sent as
text). Every request asks for usage in its last chunk (stream_options.include_usage).

Per run: requests, failures, duration, request throughput, output tokens/s, and p50 / p90 / p99
of TTFT (send to the first chunk with text), ITL (a request's mean time between tokens after
its first: (last chunk - first chunk) / (output tokens - 1)) and request latency. Several
--rate or --concurrency values make a sweep; --compare URL_A URL_B runs the same requests against
both servers at every point and writes a latency-vs-throughput plot (PNG) and a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import sys
import time

from replayjax import commandline as cli
from replayjax.bench.timing import percentile
from replayjax.bench.workload import (
    WORKLOAD_HELP,
    WORKLOADS,
    arrival_times,
    load_trace,
    synthetic_requests,
)

PROG = "replayjax bench serve"
QUANTILES = (50, 90, 99)


@dataclasses.dataclass
class Result:
    """One request as the client saw it (times in seconds from its send)."""
    ok: bool
    ttft: float = math.nan
    latency: float = math.nan
    output_tokens: int = 0
    first_chunk: float = math.nan
    last_chunk: float = math.nan
    error: str = ""

    @property
    def itl(self) -> float:
        if self.output_tokens < 2:
            return math.nan
        return (self.last_chunk - self.first_chunk) / (self.output_tokens - 1)


def base_url(url: str) -> str:
    """http://host:port from a server URL given with or without a trailing /v1."""
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def _payload(r, model: str, ignore_eos: bool) -> dict:
    """The /v1/completions body of a TraceRequest (text prompts kept as text, see _keep_text)."""
    body = {"model": model, "prompt": r.prompt[0] if r.prompt_field == "prompt" else
            list(r.prompt), "max_tokens": r.max_new_tokens, "temperature": r.temperature,
            "top_p": r.top_p, "seed": r.seed, "stream": True,
            "stream_options": {"include_usage": True}}
    if r.top_k:
        body["top_k"] = r.top_k
    if r.stop_ids:
        body["stop_token_ids"] = list(r.stop_ids)
    if ignore_eos:
        body["ignore_eos"] = True
    return body


async def _one(client, url: str, body: dict) -> Result:
    """Sends one streaming request and times its chunks."""
    t0 = time.perf_counter()
    res = Result(ok=False)
    chunks = 0
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                try:
                    text = json.loads(text)["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    pass
                res.error = f"HTTP {resp.status_code}: {text[:200]}"
                return res
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    res.ok = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    res.error = f"stream error: {chunk['error'].get('message', chunk['error'])}"
                    return res
                now = time.perf_counter() - t0
                if chunk.get("usage"):
                    res.output_tokens = chunk["usage"]["completion_tokens"]
                if any(c.get("text") for c in chunk.get("choices") or ()):
                    chunks += 1
                    res.last_chunk = now
                    if math.isnan(res.ttft):
                        res.ttft = res.first_chunk = now
    except Exception as e:           # noqa: BLE001 -- a failed request is a result, not a crash
        res.error = f"{type(e).__name__}: {e}"[:200]
        return res
    res.latency = time.perf_counter() - t0
    res.output_tokens = res.output_tokens or chunks
    if not res.ok:
        res.error = "the stream ended without [DONE]"
    return res


async def run_point(url: str, bodies: list[dict], *, rate: float | None = None,
                    concurrency: int | None = None, seed: int = 0,
                    timeout: float = 600.0) -> tuple[list[Result], float]:
    """Sends `bodies` to `url`: open loop at `rate` requests/s (Poisson) or closed loop with
    `concurrency` clients. Returns the results (in request order) and the duration in s."""
    import httpx
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    results: list[Result | None] = [None] * len(bodies)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=limits) as client:
        start = time.perf_counter()
        if rate is not None:
            arrivals = arrival_times(len(bodies), rate, "poisson", seed)

            async def send(i):
                await asyncio.sleep(max(0.0, start + arrivals[i] - time.perf_counter()))
                results[i] = await _one(client, url, bodies[i])

            await asyncio.gather(*(send(i) for i in range(len(bodies))))
        else:
            todo = iter(range(len(bodies)))

            async def worker():
                for i in todo:
                    results[i] = await _one(client, url, bodies[i])

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        return results, time.perf_counter() - start


def summarize(results: list[Result], duration: float) -> dict:
    """The row of one run: counts, throughputs and latency percentiles (ms; latency in s)."""
    ok = [r for r in results if r.ok]
    row = dict(requests=len(results), failed=len(results) - len(ok),
               duration_s=round(duration, 3),
               request_throughput=round(len(ok) / duration, 3) if duration else 0.0,
               output_tokens_per_s=round(sum(r.output_tokens for r in ok) / duration, 2)
               if duration else 0.0)
    for name, values, scale in (("ttft_ms", [r.ttft for r in ok], 1e3),
                                ("itl_ms", [r.itl for r in ok if not math.isnan(r.itl)], 1e3),
                                ("latency_s", [r.latency for r in ok], 1.0)):
        for q in QUANTILES:
            row[f"{name}_p{q}"] = round(percentile(values, q) * scale, 3)
    errors = [r.error for r in results if not r.ok]
    if errors:
        row["first_error"] = errors[0]
    return row


def served_model(url: str, timeout: float = 30.0) -> str:
    """The first model a server lists at /v1/models (UserError if it cannot be reached)."""
    import httpx
    try:
        resp = httpx.get(f"{url}/v1/models", timeout=timeout)
        resp.raise_for_status()
        return resp.json()["data"][0]["id"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
        raise cli.UserError(f"{url}: cannot list its models at /v1/models ({e})") from None


def _keep_text(text, where):
    """A trace's text prompt stays text (the server tokenizes it): (text,) as the 'ids'."""
    return [text]


def requests_of(args) -> list:
    """The TraceRequests of a run, from --trace or synthetic."""
    if args.trace:
        return load_trace(cli.existing_file("--trace", args.trace), encode=_keep_text)
    return synthetic_requests(max(args.num_requests or [64]), args.prompt_len, args.max_tokens,
                              args.vocab, seed=args.seed, workload=args.workload)


def markdown(rows: list[dict]) -> str:
    """A table of runs, one per row."""
    head = ("| server | load | requests | failed | req/s | out tok/s | TTFT ms p50 / p90 / p99 "
            "| ITL ms p50 / p90 / p99 | latency s p50 / p90 / p99 |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]

    def q(row, name):
        return " / ".join(f"{row[f'{name}_p{p}']:.3g}" for p in QUANTILES)

    for r in rows:
        lines.append(f"| {r['server']} | {r['load']} | {r['requests']} | {r['failed']} | "
                     f"{r['request_throughput']:.2f} | {r['output_tokens_per_s']:.1f} | "
                     f"{q(r, 'ttft_ms')} | {q(r, 'itl_ms')} | {q(r, 'latency_s')} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: str) -> None:
    """Latency vs throughput (output tokens/s), one line per server, one point per load:
    TTFT, ITL and request latency at p50."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, (key, label) in zip(axes, (("ttft_ms_p50", "TTFT p50 (ms)"),
                                       ("itl_ms_p50", "ITL p50 (ms)"),
                                       ("latency_s_p50", "request latency p50 (s)"))):
        for server in dict.fromkeys(r["server"] for r in rows):
            pts = [r for r in rows if r["server"] == server]
            x = [r["output_tokens_per_s"] for r in pts]
            ax.plot(x, [r[key] for r in pts], marker="o", label=server)
            for r, xi in zip(pts, x):
                ax.annotate(str(r["load"]), (xi, r[key]), textcoords="offset points",
                            xytext=(4, 4), fontsize=7)
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle("latency vs throughput (points: " + rows[0]["load"].split("=")[0] + ")")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def build_parser():
    ap = cli.parser(PROG, __doc__.split("\n\n")[0], [
        "replayjax bench serve --url http://127.0.0.1:8000 --rate 2 8 --num-requests 200 --json",
        "replayjax bench serve --compare http://127.0.0.1:8000 http://127.0.0.1:8001 "
        "--labels replay standard --concurrency 4 16 64 --plot serve.png --markdown serve.md",
        "replayjax bench serve --url http://127.0.0.1:8000 --trace requests.jsonl --rate 4"])
    target = ap.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="the server (http://host:port, with or without /v1)")
    target.add_argument("--compare", nargs=2, metavar=("URL_A", "URL_B"),
                        help="two servers run over the same requests at every point")
    ap.add_argument("--labels", nargs=2, metavar=("A", "B"),
                    help="names of the --compare servers in the table and plot (default: URLs)")
    ap.add_argument("--model", help="the model name to request (default: the first one each "
                                    "server lists at /v1/models)")
    load = ap.add_mutually_exclusive_group(required=True)
    load.add_argument("--rate", type=_positive, nargs="+",
                      help="open loop: Poisson arrivals at this many requests/s (a sweep)")
    load.add_argument("--concurrency", type=cli.at_least(1), nargs="+",
                      help="closed loop: this many clients at once (a sweep)")
    ap.add_argument("--trace", help="JSONL requests (as for `replayjax bench --trace`)")
    ap.add_argument("--num-requests", type=cli.at_least(1), nargs="+",
                    help="requests per point: one number, or one per --rate / --concurrency "
                         "value (the first N of the same requests; default: 64 synthetic, "
                         "or the whole --trace)")
    ap.add_argument("--prompt-len", type=cli.at_least(1), default=64,
                    help="synthetic prompt length (geometric mean with --workload mixed)")
    ap.add_argument("--max-tokens", type=cli.at_least(1), default=64,
                    help="synthetic tokens to generate per request")
    ap.add_argument("--workload", choices=WORKLOADS, default="mixed", help=WORKLOAD_HELP)
    ap.add_argument("--vocab", type=cli.at_least(4), default=256,
                    help="synthetic prompt ids are drawn from [3, VOCAB): valid for any model "
                         "with at least this many tokens")
    ap.add_argument("--ignore-eos", action="store_true",
                    help="send ignore_eos (vLLM, SGLang and replayjax accept it) so every "
                         "request generates max_tokens")
    ap.add_argument("--seed", type=cli.at_least(0), default=0,
                    help="synthetic prompts and Poisson arrivals")
    ap.add_argument("--timeout", type=_positive, default=600.0, help="seconds per request")
    ap.add_argument("--plot", help="latency-vs-throughput PNG (default with --compare: "
                                   "bench_serve.png)")
    ap.add_argument("--markdown", help="write the table here too (default with --compare: "
                                       "bench_serve.md)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    return ap


def _positive(text):
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not v > 0 or math.isinf(v):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
    return v


def _body(args) -> int:
    servers = ([(args.url, args.url)] if args.url else
               list(zip(args.labels or args.compare, args.compare)))
    if args.labels and not args.compare:
        raise cli.UserError("--labels names the two --compare servers")
    if args.compare:
        args.plot = args.plot or "bench_serve.png"
        args.markdown = args.markdown or "bench_serve.md"
    cli.output_path("--plot", args.plot)
    cli.output_path("--markdown", args.markdown)
    kind, points = ("rate", args.rate) if args.rate else ("concurrency", args.concurrency)
    counts = args.num_requests or [None]
    if len(counts) not in (1, len(points)):
        raise cli.UserError(f"--num-requests: give one number or one per --{kind} value "
                            f"({len(points)}), got {len(counts)}")
    counts = counts * len(points) if len(counts) == 1 else counts
    reqs = requests_of(args)
    urls = [(label, base_url(url)) for label, url in servers]
    models = {url: args.model or served_model(url) for _, url in urls}
    progress = cli.Progress(len(points) * len(urls), cli.interactive(args))
    rows = []
    for point, count in zip(points, counts):
        for label, url in urls:
            bodies = [_payload(r, models[url], args.ignore_eos) for r in reqs[:count]]
            with progress.stage(f"{label} {kind}={point}"):
                results, duration = asyncio.run(run_point(
                    url, bodies, rate=point if kind == "rate" else None,
                    concurrency=point if kind == "concurrency" else None, seed=args.seed,
                    timeout=args.timeout))
            rows.append(dict(server=label, load=f"{kind}={point:g}",
                             **summarize(results, duration)))
    progress.close()
    table = markdown(rows)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table)
    if args.plot:
        plot(rows, args.plot)
    print(json.dumps(rows, indent=1) if args.json else table, end="" if not args.json else "\n")
    for r in rows:
        if "first_error" in r:
            print(f"{PROG}: {r['server']} {r['load']}: {r['failed']} failed, the first: "
                  f"{r['first_error']}", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return cli.run(PROG, args, _body)
