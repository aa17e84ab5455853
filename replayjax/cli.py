"""The `replayjax` command line: each subcommand is a module with its own `main(argv)`."""

from __future__ import annotations

import sys

COMMANDS = {
    "generate": ("replayjax.generate_cli", "generate from prompts (batch, sampling, speculation)"),
    "convert": ("convert.cli", "Hugging Face safetensors -> orbax checkpoint, streaming"),
    "bench": ("replayjax.bench.e2e", "A/B: standard vs ReplaySSM (and speculation) on the same "
                                     "requests"),
    "bench kernels": ("replayjax.bench.kernels", "standard vs ReplaySSM decode kernels (GPU)"),
    "bench verify": ("replayjax.bench.verify", "speculative verify vs state-per-draft (GPU)"),
    "bench moe": ("replayjax.bench.moe", "one sparse MoE layer at real model dimensions (GPU)"),
    "profile": ("replayjax.bench.profile", "decode-step trace, kernel classes and roofline"),
    "launch": ("replayjax.launch", "a command as one process per GPU (jax.distributed)"),
}

USAGE = "usage: replayjax COMMAND [options]   (replayjax COMMAND --help for each)\n\n" + \
    "Decode hybrid SSM/attention models (Nemotron-H, Qwen3-Next, Qwen3.5) in JAX with " \
    "ReplaySSM.\n\ncommands:\n" + "".join(f"  {name:<15} {text}\n"
                                            for name, (_, text) in COMMANDS.items())


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    name = " ".join(argv[:2]) if " ".join(argv[:2]) in COMMANDS else argv[0]
    if name not in COMMANDS:
        print(f"replayjax: unknown command {argv[0]!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    module = __import__(COMMANDS[name][0], fromlist=["main"])
    return module.main(argv[len(name.split()):])


if __name__ == "__main__":
    sys.exit(main())
