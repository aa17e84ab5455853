"""`replayjax serve`: an OpenAI-compatible HTTP server (Starlette under uvicorn) over one engine.

Flags are checked when parsed (exit 2, one line); a model directory the server cannot use is one
line too (exit 1). The port is bound before the model loads, so a taken port fails at once. The
first SIGTERM or SIGINT drains: new requests get 503, those in flight get --shutdown-timeout
seconds to finish, the rest end with finish_reason "abort", and the process exits 0; a second
signal ends that wait at once (the requests in flight end with "abort" now); a third is uvicorn's
own forced exit.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
import time

import uvicorn

from replayjax import commandline as cli
from replayjax.bench.synthetic import SYNTHETIC
from replayjax.commandline import MAX_TOP_LOGPROBS, MAX_VERIFY_TOKENS
from replayjax.server.tools import FORMATS as TOOL_FORMATS
from replayjax.server.tools import template_format

PROG = "replayjax serve"
DEMO_NAME = "replayjax-demo"
DEFAULT_NUM_DRAFT = 3
GRACEFUL_S = 5            # uvicorn: after the drain, time for connections to close

log = logging.getLogger("replayjax.server")


class ServeError(cli.UserError):
    """A problem the user can fix, reported as one line (exit 1)."""


def _speculative(text):
    """none | ngram | mtp | draft:DIR -> (drafter or None, draft model dir or None)."""
    if text in ("none", "ngram", "mtp"):
        return (None if text == "none" else text), None
    if text.startswith("draft:") and text[len("draft:"):]:
        return "draft", text[len("draft:"):]
    raise argparse.ArgumentTypeError(f"expected none, ngram, mtp or draft:DIR, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    ap = cli.parser(PROG, "Serve a model over HTTP with OpenAI's API (/v1/completions,\n"
                          "/v1/chat/completions, /v1/models), /health and /metrics. Then, e.g.:\n"
                          "  curl localhost:8000/v1/completions "
                          "-d '{\"model\": \"replayjax-demo\", "
                          "\"prompt\": \"This program\", \"max_tokens\": 32}'", [
                              f"{PROG}                     # the demo model on 127.0.0.1:8000",
                              f"{PROG} --model DIR --port 8001 --speculative mtp --num-slots 64"])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--model", type=cli.nonempty,
                     help="Hugging Face checkpoint dir or a `replayjax convert` output dir, with "
                          "tokenizer.json (default: the demo model shipped with the package)")
    src.add_argument("--synthetic", choices=sorted(SYNTHETIC), metavar="NAME",
                     help="a model of real dimensions with random weights, for load tests: "
                          f"{', '.join(sorted(SYNTHETIC))} (with an MTP head for --speculative "
                          "mtp; its tokenizer spells token i as ' <i>'; no chat template "
                          "unless --chat-template)")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"],
                    help="--synthetic weights (default: bfloat16)")
    ap.add_argument("--served-model-name", type=cli.nonempty,
                    help="the model name requests give (default: the model dir's name; "
                         f"{DEMO_NAME} for the demo model)")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on")
    ap.add_argument("--port", type=cli.in_range(1, 65535), default=8000, help="TCP port")
    ap.add_argument("--chat-template", type=cli.nonempty, metavar="FILE",
                    help="Jinja chat template (default: the model dir's chat_template.jinja or "
                         "tokenizer_config.json chat_template)")
    ap.add_argument("--tool-call-format", choices=["auto", *TOOL_FORMATS, "none"],
                    default="auto",
                    help="how the model writes tool calls, for chat requests with 'tools': "
                         "auto (read off the chat template), hermes (<tool_call>{json}"
                         "</tool_call>: Qwen3, Qwen3-Next), xml (<tool_call><function=...>: "
                         "Qwen3.5, Nemotron 3), toolcall (<TOOLCALL>[json]</TOOLCALL>: "
                         "Nemotron-H), none (requests with tools are refused)")
    ap.add_argument("--max-logprobs", type=cli.in_range(0, MAX_TOP_LOGPROBS), metavar="N",
                    help="let requests ask for log probabilities (completions 'logprobs', chat "
                         "'logprobs' / 'top_logprobs') with up to N alternatives a token; the "
                         "engine then computes them at every step (a log-softmax and a top-N "
                         "over the vocabulary), so they are off by default")
    ap.add_argument("--reasoning", choices=["auto", "none"], default="auto",
                    help="auto: when the chat template thinks in <think> blocks (Qwen3.5, "
                         "Nemotron 3, ...), a chat reply's thinking comes back as "
                         "reasoning_content, apart from its content; none: all of it is "
                         "content")
    ap.add_argument("--ssm-mode", choices=["replay", "standard"], default="replay",
                    help="SSM decode: ReplaySSM, or the standard recurrence (the baseline)")
    ap.add_argument("--window", type=cli.window, default=16, help="ReplaySSM ring window L")
    ap.add_argument("--state-dtype", choices=["float32", "bfloat16"], default="float32",
                    help="SSM state (checkpoint) dtype")
    ap.add_argument("--speculative", type=_speculative, default="none",
                    help="none | ngram | mtp (needs MTP weights) | draft:DIR (a smaller model "
                         "with the same vocabulary)")
    ap.add_argument("--num-draft", type=cli.at_least(1),
                    help=f"tokens drafted per speculative step (default {DEFAULT_NUM_DRAFT}; "
                         "needs --speculative)")
    ap.add_argument("--num-slots", type=cli.at_least(1), default=32,
                    help="requests decoded together")
    ap.add_argument("--max-queue", type=cli.at_least(1), default=256,
                    help="requests waiting for a slot before new ones get 429")
    ap.add_argument("--max-request-mb", type=cli.number(0, lo_open=True), default=16.0,
                    metavar="MB", help="largest request body accepted (a larger one gets a 413)")
    ap.add_argument("--max-len", type=cli.at_least(16), default=2048,
                    help="cache length per slot: prompt + generated tokens (+ drafts)")
    ap.add_argument("--steps-per-visit", type=cli.at_least(1), default=8,
                    help="decode steps (or speculative steps of a device drafter) run on device "
                         "between two host visits (streaming and "
                         "admission happen between visits)")
    cli.add_prefix_arguments(ap)
    cli.add_batching_argument(ap)
    cli.add_tp_argument(ap)
    ap.add_argument("--warmup", choices=["first", "all"], default="first",
                    help="compile before serving the first prompt-length bucket (a new length "
                         "compiles when it first arrives, stalling the running streams "
                         "meanwhile: seconds on an 8B model), or every bucket up to --max-len "
                         "(a longer start; no request then waits for a compilation)")
    ap.add_argument("--shutdown-timeout", type=cli.number(0), default=30.0,
                    help="on SIGTERM / SIGINT: seconds for requests in flight to finish")
    ap.add_argument("--log-level", choices=["debug", "info", "warning", "error"],
                    default="info", help="server log (uvicorn's access log at info)")
    return ap


def parse_args(argv=None) -> argparse.Namespace:
    """The flags, checked (exit 2 with one line otherwise); sets args.drafter, args.draft_dir
    and args.num_draft (0 without speculation)."""
    ap = build_parser()
    args = ap.parse_args(argv)
    args.drafter, args.draft_dir = args.speculative
    if args.dtype and not args.synthetic:
        ap.error("argument --dtype: only with --synthetic (a checkpoint has its own dtype)")
    if args.drafter is None:
        if args.num_draft is not None:
            ap.error("argument --num-draft: needs --speculative ngram, mtp or draft:DIR")
        args.num_draft = 0
    else:
        limit = min(MAX_VERIFY_TOKENS - 1, args.window - 1)
        if limit < 1:
            ap.error(f"argument --speculative: needs --window >= 2, got {args.window}")
        if args.num_draft is None:
            args.num_draft = min(DEFAULT_NUM_DRAFT, limit)
        elif args.num_draft > limit:
            ap.error(f"argument --num-draft: must be <= {limit} with --window {args.window} "
                     f"(at most {MAX_VERIFY_TOKENS} verify tokens), got {args.num_draft}")
    return args


def build_engine(args, model_dir: str | None):
    """The engine the flags describe, warmed up (prefill and decode / verify compiled), split
    over --tp devices of this process (one process drives them all: the HTTP loop is not
    replicated across `replayjax launch` processes). model_dir None: --synthetic."""
    import jax
    import jax.numpy as jnp

    from convert import ConvertError
    from replayjax import demo
    from replayjax.bench.synthetic import build
    from replayjax.engine import Engine
    from replayjax.loading import load_model
    if jax.process_count() > 1:
        raise ServeError("serve drives its GPUs from one process: run it with --tp N, not under "
                         "`replayjax launch`")
    mesh, experts = cli.tp_placement(args)
    model = (build(args.synthetic, jnp.dtype(args.dtype or "bfloat16"),
                   mtp=args.drafter == "mtp", mesh=mesh, experts=experts)
             if model_dir is None else load_model(model_dir, mesh=mesh, experts=experts,
                                                  dtype=None if args.model else demo.DTYPE))
    try:
        draft = (load_model(args.draft_dir, mesh=mesh, experts=experts) if args.draft_dir
                 else None)
    except ConvertError as e:
        raise ServeError(f"--speculative draft: {e}") from None
    try:
        engine = Engine(model, draft_model=draft, logprobs=args.max_logprobs,
                        **cli.engine_settings(args))
    except ValueError as e:
        raise ServeError(cli.engine_error(e)) from None
    engine.warm_up_buckets(every_bucket=args.warmup == "all")     # compile before serving
    return engine


def tool_format(flag: str, source: str | None) -> str | None:
    """--tool-call-format: the format of the chat template whose source is given ("auto"; None
    without a template or for one that renders no tools), the one named, or None ("none":
    requests with tools refused)."""
    if flag == "auto":
        return template_format(source)
    return None if flag == "none" else flag


def build_state(args):
    """Everything the app serves, from the flags: model, tokenizer, chat template, engine thread
    (not started), metrics."""
    from replayjax import demo
    from replayjax.sampling import SamplingParams
    from replayjax.server.app import ServerState
    from replayjax.server.chat import load_chat_template
    from replayjax.server.metrics import Metrics
    from replayjax.server.model_files import (
        generation_settings,
        load_tokenizer,
        synthetic_tokenizer,
    )
    from replayjax.server.protocol import ServedModel
    from replayjax.server.reasoning import template_thinks
    from replayjax.server.worker import EngineWorker

    if args.synthetic:
        engine = build_engine(args, None)
        tokenizer = synthetic_tokenizer(engine.vocab)
        template = (load_chat_template(os.path.dirname(args.chat_template), args.chat_template)
                    if args.chat_template else None)
        eos, defaults = (), SamplingParams()
        name = args.served_model_name or args.synthetic
    else:
        model_dir = args.model or demo.model_dir()
        if not os.path.isdir(model_dir):
            raise ServeError(f"--model {model_dir}: no such directory")
        tokenizer = load_tokenizer(model_dir)
        template = load_chat_template(model_dir, args.chat_template)
        eos, defaults = generation_settings(model_dir)
        engine = build_engine(args, model_dir)
        if bad := [t for t in eos if not 0 <= t < engine.vocab]:
            raise ServeError(f"{model_dir}: eos_token_id {bad} outside the vocabulary "
                             f"[0, {engine.vocab})")
        name = args.served_model_name or (
            DEMO_NAME if args.model is None else os.path.basename(os.path.normpath(model_dir)))
    served = ServedModel(name=name, vocab=engine.vocab, max_len=args.max_len,
                         num_draft=args.num_draft, eos_ids=eos, defaults=defaults,
                         max_logprobs=args.max_logprobs)
    worker = EngineWorker(engine)
    source = template.source if template is not None else None
    return ServerState(worker=worker, tokenizer=tokenizer, chat_template=template,
                       served=served, metrics=Metrics(worker.load, args.num_draft),
                       max_queue=args.max_queue,
                       max_body_bytes=int(args.max_request_mb * 1e6),
                       tool_format=tool_format(args.tool_call_format, source),
                       reasoning=args.reasoning == "auto" and template_thinks(source))


def _bind(host: str, port: int) -> socket.socket:
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(info[0], socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(info[4])
    except OSError as e:
        raise ServeError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server whose first SIGTERM / SIGINT drains the app (`ServerState.drain`) before
    it stops; a second one aborts the requests still in flight at once (they end with
    finish_reason "abort", streams with [DONE]) and stops; a third leaves it to uvicorn."""

    def __init__(self, config, state, shutdown_timeout):
        super().__init__(config)
        self.state, self.shutdown_timeout = state, shutdown_timeout
        self._loop = self._drain = None

    async def serve(self, sockets=None):
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig, frame):
        if self._loop is None or self.state.hurry:      # a third signal: uvicorn's own exit
            return super().handle_exit(sig, frame)
        if self._drain is not None:
            log.warning("replayjax serve: stopping now (aborting the requests in flight)")
            self.state.hurry = True     # read by the drain's loop (a bool: no lock needed)
            return
        log.warning("replayjax serve: draining (%g s for requests in flight)",
                    self.shutdown_timeout)
        self._drain = True
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self):
        self._drain = self._loop.create_task(self._drain_and_exit())

    async def _drain_and_exit(self):
        await self.state.drain(self.shutdown_timeout)
        self.should_exit = True


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s:  %(message)s")
    logging.getLogger("replayjax").setLevel(args.log_level.upper())
    logging.getLogger("absl").setLevel(logging.CRITICAL)   # orbax logs what load_model raises
    return cli.run(PROG, args, _serve)


def _serve(args) -> int:
    if args.chat_template:
        cli.existing_file("--chat-template", args.chat_template)
    t0 = time.perf_counter()
    sock = _bind(args.host, args.port)
    try:
        state = build_state(args)
    except BaseException:
        sock.close()
        raise
    from replayjax.server.app import create_app

    config = uvicorn.Config(create_app(state), log_level=args.log_level, lifespan="off",
                            timeout_graceful_shutdown=GRACEFUL_S)
    server = _Server(config, state, args.shutdown_timeout)
    s = state.served
    print(f"{PROG}: {s.name!r} on http://{args.host}:{args.port} ({args.num_slots} slots, "
          f"max_len {s.max_len}, ssm {args.ssm_mode}, speculative "
          f"{args.drafter or 'none'}{f' K={s.num_draft}' if s.num_draft else ''}; ready in "
          f"{time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
    state.worker.start()
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:              # a second Ctrl-C: stopped without the drain
        return 130
    finally:
        state.worker.stop(timeout=GRACEFUL_S)
    return 0
