"""The `replayjax` command line: each subcommand is a module with its own `main(argv)`."""

from __future__ import annotations

import difflib
import sys

COMMANDS = {
    "generate": ("replayjax.generate_cli", "generate from prompts (batch, sampling, speculation)"),
    "serve": ("replayjax.server.cli", "OpenAI-compatible HTTP server (completions, chat, "
                                      "streaming, metrics)"),
    "convert": ("replayjax.convert_cli", "Hugging Face safetensors -> orbax checkpoint, streaming"),
    "bench": ("replayjax.bench.e2e", "A/B: standard vs ReplaySSM (and speculation) on the same "
                                     "requests"),
    "bench kernels": ("replayjax.bench.kernels", "standard vs ReplaySSM decode kernels (GPU)"),
    "bench verify": ("replayjax.bench.verify", "speculative verify vs state-per-draft (GPU)"),
    "bench serve": ("replayjax.bench.serve", "load generator over HTTP against OpenAI-compatible "
                                             "servers (latency vs throughput)"),
    "bench moe": ("replayjax.bench.moe", "one sparse MoE layer at real model dimensions (GPU)"),
    "bench attention": ("replayjax.bench.attention", "decode attention over the KV pool: "
                                                     "Pallas kernel vs XLA (GPU)"),
    "bench conv": ("replayjax.bench.conv", "decode conv + conv-state update over the slot pool: "
                                           "Pallas kernel vs XLA (GPU)"),
    "bench prefill": ("replayjax.bench.prefill", "prefill tokens/s of a batch of prompts, "
                                                 "with its FLOP and byte roofline"),
    "profile": ("replayjax.bench.profile", "decode-step trace, kernel classes and roofline"),
    "launch": ("replayjax.launch", "a command as one process per GPU (jax.distributed)"),
}

GROUPS = {name.split()[0] for name in COMMANDS if " " in name}   # "bench": bench COMMAND

USAGE = "usage: replayjax COMMAND [options]   (replayjax COMMAND --help for each)\n\n" + \
    "Decode hybrid SSM/attention models (Nemotron-H, Qwen3-Next, Qwen3.5) in JAX with " \
    "ReplaySSM.\n\ncommands:\n" + "".join(f"  {name:<16} {text}\n"
                                            for name, (_, text) in COMMANDS.items()) + \
    "\noptions:\n  -h, --help       this list\n  --version        print the version and exit\n" \
    "\nexamples:\n  replayjax generate --prompt \"This program is free software; \"\n" \
    "  replayjax generate --help\n"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if argv[0] == "--version":
        from replayjax.commandline import version
        print(version())
        return 0
    name = " ".join(argv[:2]) if " ".join(argv[:2]) in COMMANDS else argv[0]
    if name not in COMMANDS or (name in GROUPS and len(argv) > 1 and argv[1][:1] != "-"):
        given = " ".join(argv[:2]) if name in GROUPS else argv[0]
        near = difflib.get_close_matches(given, list(COMMANDS), 1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        print(f"replayjax: error: unknown command {given!r} (commands: "
              f"{', '.join(COMMANDS)}){hint}", file=sys.stderr)
        return 2
    try:        # importing a command loads jax: Ctrl-C there is an interruption too
        module = __import__(COMMANDS[name][0], fromlist=["main"])
        return module.main(argv[len(name.split()):])
    except KeyboardInterrupt:
        if "--debug" in argv:
            raise
        print(f"replayjax {name}: error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
