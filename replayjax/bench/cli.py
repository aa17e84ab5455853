"""Command-line plumbing shared by the bench commands: parsers whose errors are one line, argument
types that validate at parse time, `run` (no traceback reaches the user) and terminal progress."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import pkgutil
import sys


class BenchError(Exception):
    """A problem the user can fix (bad input, a model that does not fit): reported as one line,
    exit status 1."""


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's and examples' line breaks and shows every option's default
    (options without one -- None, or off for switches -- say so in their help)."""

    def _get_help_string(self, action):
        text, default = action.help or "", action.default
        if default is None or default is False or default is argparse.SUPPRESS or \
                "%(default)" in text or not action.option_strings:
            return text
        shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else default
        return f"{text} (default: {shown})".replace("%", "%%")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, `PROG: error: argument --flag: why` (exit 2),
    without the usage block."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def parser(prog: str, description: str, examples: list[str]) -> Parser:
    """A parser for command `prog` with `description` and the `examples` listed after the
    options; it carries --debug (re-raise errors with their traceback)."""
    ap = Parser(prog=prog, description=description, formatter_class=_Formatter,
                epilog="examples:\n" + "\n".join(f"  {e}" for e in examples))
    ap.add_argument("--debug", action="store_true",
                    help="show the full traceback of an error instead of one line")
    return ap


# ---------------------------------------------------------------------- argument types

def _int(text):
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def at_least(lo: int):
    """argparse type: an integer >= lo."""
    def check(text):
        v = _int(text)
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {v}")
        return v
    check.__name__ = f"integer >= {lo}"
    return check


def in_range(lo: int, hi: int):
    """argparse type: an integer in [lo, hi]."""
    def check(text):
        v = _int(text)
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"must be in [{lo}, {hi}], got {v}")
        return v
    check.__name__ = f"integer in [{lo}, {hi}]"
    return check


def power_of_two(text):
    """argparse type: a power of two >= 1 (ring windows)."""
    v = _int(text)
    if v < 1 or v & (v - 1):
        raise argparse.ArgumentTypeError(f"must be a power of two, got {v}")
    return v


def json_of(kind: type, what: str):
    """argparse type: JSON text decoding to `kind` (dict or list), e.g. a tiling."""
    def check(text):
        try:
            v = json.loads(text)
        except json.JSONDecodeError as e:
            raise argparse.ArgumentTypeError(f"not valid JSON ({e.msg}, column {e.colno}): "
                                             f"{text!r}") from None
        if not isinstance(v, kind):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return v
    check.__name__ = what
    return check


def tilings(text):
    """argparse type: a JSON list of tiling objects, e.g. '[{"block_p": 32}, {}]'."""
    v = json_of(list, "a JSON list of objects")(text)
    if not v or not all(isinstance(c, dict) for c in v):
        raise argparse.ArgumentTypeError(f"must be a non-empty JSON list of objects, got {text!r}")
    return v


def existing_dir(flag: str, path: str) -> str:
    if not os.path.isdir(path):
        raise BenchError(f"{flag} {path}: no such directory")
    return path


def existing_file(flag: str, path: str) -> str:
    if not os.path.isfile(path):
        raise BenchError(f"{flag} {path}: no such file")
    return path


def output_file(flag: str, path: str | None) -> str | None:
    """An output path whose directory exists (checked before the work that fills it)."""
    if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise BenchError(f"{flag} {path}: the directory does not exist")
    return path


def require_gpu():
    """The kernel benchmarks time compiled Pallas kernels with CUPTI: a CUDA GPU or nothing."""
    import jax
    if jax.default_backend() != "gpu":
        raise BenchError(f"needs a CUDA GPU (jax.default_backend() is {jax.default_backend()!r})")


def tp_mesh(tp: int):
    """The tensor-parallel mesh of --tp (None for 1): the first tp devices of every process
    (BenchError if there are fewer)."""
    if tp == 1:
        return None
    from models.sharding import make_mesh
    try:
        return make_mesh(tp)
    except ValueError as e:
        raise BenchError(f"--tp {tp}: {e}") from None


def add_tp_argument(ap):
    ap.add_argument("--tp", type=at_least(1), default=1,
                    help="tensor-parallel degree: the model split over this many devices (this "
                         "host's GPUs; one process per GPU: `replayjax launch`)")


def check_model_dir(path: str) -> str:
    """--model DIR exists and, when it holds a config.json, that config parses (cheap checks
    before any heavy work; loading the weights checks the rest)."""
    existing_dir("--model", path)
    if os.path.isfile(os.path.join(path, "config.json")):
        from models.config import ConfigError, load_config
        try:
            load_config(path)
        except ConfigError as e:
            raise BenchError(f"--model {path}: {e}") from None
    return path


# ---------------------------------------------------------------------- running a command

def run(prog: str, args, body) -> int:
    """Calls body(args) and returns its exit status; an error becomes one line on stderr (exit 1;
    130 on Ctrl-C) unless args.debug, which re-raises it with its traceback."""
    try:
        return body(args) or 0
    except KeyboardInterrupt:
        if args.debug:
            raise
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:   # noqa: BLE001 -- the one place every error is turned into a line
        if args.debug:
            raise
        print(f"{prog}: error: {one_line(e)}", file=sys.stderr)
        return 1


def one_line(e: BaseException) -> str:
    """The first line of an exception's message; for anything but an input error (whose message
    names what and where) also its type and a pointer to --debug."""
    from models.config import ConfigError
    from convert import ConvertError
    lines = str(e).strip().splitlines()
    text = lines[0] if lines else ""
    if isinstance(e, (BenchError, ConfigError, ConvertError)):
        return text
    return f"{type(e).__name__}: {text} (--debug shows the traceback)"


# ---------------------------------------------------------------------- environment

def gpu_plugin_installed() -> bool:
    """Whether JAX would pick a GPU, judged without starting a backend (which would claim most
    of the GPU's memory): a CUDA/ROCm PJRT plugin is installed and JAX_PLATFORMS allows it."""
    platforms = os.environ.get("JAX_PLATFORMS", "")
    if platforms and not any(p in platforms for p in ("cuda", "gpu", "rocm")):
        return False
    if importlib.util.find_spec("jax_plugins") is None:
        return False
    import jax_plugins
    return any(("cuda" in m.name or "rocm" in m.name)
               for m in pkgutil.iter_modules(jax_plugins.__path__))


class Progress:
    """A terminal progress bar over named stages (tqdm, on stderr); silent when `enabled` is
    False. Commands enable it unless --json or stdout/stderr is not a terminal."""

    def __init__(self, total: int, enabled: bool):
        from tqdm import tqdm
        self.bar = tqdm(total=total, disable=not enabled, file=sys.stderr, leave=False,
                        bar_format="{desc} [{n_fmt}/{total_fmt}, {elapsed}]")

    @contextlib.contextmanager
    def stage(self, text: str):
        self.bar.set_description_str(text)
        self.bar.refresh()
        yield
        self.bar.update(1)

    def close(self):
        self.bar.close()


def interactive(args) -> bool:
    """Progress bars are for people watching: not with --json, not into pipes or files."""
    return not getattr(args, "json", False) and sys.stdout.isatty() and sys.stderr.isatty()
