"""Command-line plumbing shared by every `replayjax` command: parsers whose errors are one line
(exit 2) and whose help shows every default and ends with examples, argument types that validate
at parse time, checks of input and output paths before any heavy work, `run` (no traceback
reaches the user: exit 1 with one line, 130 on Ctrl-C) and terminal progress.

This module imports nothing heavy, so a bad flag is refused before jax or a model is loaded.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import json
import math
import os
import pkgutil
import re
import sys
import threading
import time

# pallas_kernels.ring's limits and replayjax.requests' MAX_TOP_LOGPROBS, repeated so that parsing
# a flag does not import jax (a test checks they agree)
MAX_WINDOW = 64
MAX_VERIFY_TOKENS = 8
MAX_TOP_LOGPROBS = 20
INT32_MAX = 2 ** 31 - 1


class UserError(Exception):
    """A problem the user can fix (bad input, a model that does not fit): reported as its
    one-line message, exit status 1."""


# ---------------------------------------------------------------------- parsers

class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's and examples' line breaks and shows every option's default
    (options without one -- None, an empty list, or off for switches -- say what their absence
    means in their help)."""

    def _get_help_string(self, action):
        text, default = action.help or "", action.default
        if default is None or default is False or default == [] or \
                default is argparse.SUPPRESS or "%(default)" in text or not action.option_strings:
            return text
        shown = default
        if isinstance(default, (list, tuple)):      # flags' values as typed: 1 8 32, or JSON
            scalar = all(isinstance(v, (int, float, str)) for v in default)
            shown = " ".join(map(str, default)) if scalar else json.dumps(default)
        return f"{text} (default: {shown})".replace("%", "%%")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, `PROG: error: argument --flag: why` (exit 2),
    without the usage block, and which takes -inf, -nan and -1e3 as values (to refuse them by
    the flag's rule) rather than as unknown options."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._negative_number_matcher = re.compile(
            r"^-(\d+|\d*\.\d+)([eE][-+]?\d+)?$|^-(inf|infinity|nan)$", re.IGNORECASE)

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


def version() -> str:
    """`replayjax 0.1.0 (jax 0.11.2)`, read without importing jax."""
    from replayjax import __version__
    try:
        jax = f" (jax {importlib.metadata.version('jax')})"
    except importlib.metadata.PackageNotFoundError:
        jax = ""
    return f"replayjax {__version__}{jax}"


def parser(prog: str, description: str, examples: list[str]) -> Parser:
    """A parser for command `prog` with `description` and the `examples` listed after the
    options; it carries --debug (errors keep their traceback) and --version."""
    ap = Parser(prog=prog, description=description, formatter_class=_Formatter,
                epilog="examples:\n" + "\n".join(f"  {e}" for e in examples))
    ap.add_argument("--debug", action="store_true",
                    help="show the full traceback of an error instead of one line")
    ap.add_argument("--version", action="version", version=version(),
                    help="print the version and exit")
    return ap


# ---------------------------------------------------------------------- argument types
# Each raises ArgumentTypeError, which argparse reports as `argument --flag: why` (exit 2).

def _int(text):
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def at_least(lo: int):
    """argparse type: an integer >= lo (and <= INT32_MAX: counts end up in int32 arrays)."""
    def check(text):
        v = _int(text)
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {v}")
        if v > INT32_MAX:
            raise argparse.ArgumentTypeError(f"must be <= {INT32_MAX}, got {v}")
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


def window(text):
    """argparse type: a ReplaySSM ring window, a power of two in [1, MAX_WINDOW]."""
    v = _int(text)
    if not 1 <= v <= MAX_WINDOW or v & (v - 1):
        raise argparse.ArgumentTypeError(f"must be a power of two in [1, {MAX_WINDOW}], got {v}")
    return v


def number(lo: float, hi: float = math.inf, *, lo_open: bool = False, note: str = ""):
    """argparse type: a finite number in [lo, hi] ((lo, hi] with lo_open); `note` follows the
    rule in the error (e.g. what 0 means)."""
    rule = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]" if hi < math.inf else \
        f"{'>' if lo_open else '>='} {lo:g}"
    rule = f"a finite number {'in ' if hi < math.inf else ''}{rule}{note}"

    def check(text):
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not (math.isfinite(v) and (lo < v if lo_open else lo <= v) and v <= hi):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
        return v
    check.__name__ = rule
    return check


def token_ids(text):
    """argparse type: comma-separated token ids (integers >= 0), at least one."""
    parts = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in parts):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated token ids such as 1,2,3, got {text!r}")
    try:
        ids = [int(t) for t in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integer token ids, got {text!r}") from None
    if bad := [t for t in ids if t < 0]:
        raise argparse.ArgumentTypeError(f"token ids must be >= 0, got {bad[0]}")
    return ids


def nonempty(text):
    """argparse type: a string with something other than whitespace in it."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


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


# ---------------------------------------------------------------------- paths (exit 1)

def existing_file(flag: str, path: str) -> str:
    """A readable, non-empty regular file."""
    if not os.path.exists(path):
        raise UserError(f"{flag} {path}: no such file")
    if os.path.isdir(path):
        raise UserError(f"{flag} {path}: is a directory, expected a file")
    if not os.access(path, os.R_OK):
        raise UserError(f"{flag} {path}: permission denied")
    if os.path.getsize(path) == 0:
        raise UserError(f"{flag} {path}: empty file")
    return path


def output_path(flag: str, path: str | None, *, directory: bool = False) -> str | None:
    """An output file (or, with `directory`, a directory that may exist) whose parent exists and
    is writable; checked before the work that fills it."""
    if not path:
        return path
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UserError(f"{flag} {path}: directory {parent} does not exist")
    if os.path.isdir(path) and not directory:
        raise UserError(f"{flag} {path}: is a directory, expected a file name")
    if os.path.exists(path) and directory and not os.path.isdir(path):
        raise UserError(f"{flag} {path}: exists and is not a directory")
    target = path if os.path.exists(path) else parent
    if not os.access(target, os.W_OK):
        raise UserError(f"{flag} {path}: permission denied")
    return path


@contextlib.contextmanager
def atomic_output(path: str, mode: str = "w"):
    """Yields a file opened on a temporary name beside `path`, renamed to `path` when the block
    succeeds and removed when it fails: an output is whole or absent, never half-written."""
    tmp = os.path.join(os.path.dirname(os.path.abspath(path)),
                       f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        with open(tmp, mode) as f:
            yield f
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def write_json(path: str, obj) -> None:
    """`obj` as indented JSON into `path`, whole or not at all."""
    with atomic_output(path) as f:
        json.dump(obj, f, indent=1)


def model_dir(flag: str, path: str):
    """(config, whether it has an MTP head) of the model directory (HF or converted) at `path`,
    after the checks that read no weights (`replayjax.loading.describe_model`); UserError naming
    `flag` otherwise. Loading the weights checks the rest."""
    from convert import ConvertError
    from replayjax.loading import describe_model
    try:
        return describe_model(path)
    except ConvertError as e:
        raise UserError(f"{flag}: {e}") from None


# ---------------------------------------------------------------------- running a command

def run(prog: str, args, body) -> int:
    """Calls body(args) and returns its exit status; an error becomes one line on stderr (exit 1;
    130 on Ctrl-C) unless args.debug, which re-raises it with its traceback."""
    try:
        return body(args) or 0
    except KeyboardInterrupt as e:
        if args.debug:
            raise
        print(f"{prog}: error: {str(e) or 'interrupted'}", file=sys.stderr)
        return 130
    except Exception as e:   # noqa: BLE001 -- the one place every error is turned into a line
        if args.debug:
            raise
        print(f"{prog}: error: {one_line(e)}", file=sys.stderr)
        return 1


def one_line(e: BaseException) -> str:
    """An exception's message on one line; for anything but an input error (whose message names
    what and where) also its type and a pointer to --debug."""
    from convert import ConvertError
    from models.config import ConfigError
    text = " ".join(str(e).split())
    if isinstance(e, (UserError, ConfigError, ConvertError)):
        return text
    first = _first_line(e)
    if out_of_memory(e):
        return f"out of memory: {first[:200]} (--debug shows the traceback)"
    return f"{type(e).__name__}: {first} (--debug shows the traceback)"


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else ""


def out_of_memory(e: BaseException) -> bool:
    """Whether `e` is a host or device allocation failure (XLA's RESOURCE_EXHAUSTED)."""
    return isinstance(e, MemoryError) or "RESOURCE_EXHAUSTED" in _first_line(e)


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


def require_gpu():
    """The kernel benchmarks time compiled Pallas kernels with CUPTI: a CUDA GPU or nothing."""
    import jax
    if jax.default_backend() != "gpu":
        raise UserError(f"needs a CUDA GPU (jax.default_backend() is {jax.default_backend()!r})")


def engine_settings(args) -> dict:
    """The `Engine(...)` keyword arguments of the engine flags `generate` and `serve` share
    (--num-slots, --max-len, --ssm-mode, --window, --state-dtype, --steps-per-visit, the
    speculation and prefix-cache flags, --dynamic-batch)."""
    import jax.numpy as jnp
    return dict(num_slots=args.num_slots, max_len=args.max_len, ssm_mode=args.ssm_mode,
                window=args.window, state_dtype=jnp.dtype(args.state_dtype),
                steps_per_visit=args.steps_per_visit, num_draft=args.num_draft,
                drafter=args.drafter, prefix_cache_gb=args.prefix_cache_gb,
                prefix_block=prefix_block(args), prefix_host_gb=args.prefix_cache_host_gb,
                batch_invariant=not args.dynamic_batch)


def prefix_block(args) -> int:
    """--prefix-block (PREFIX_BLOCK unless given); UserError if given without a prefix cache,
    which it would not change."""
    if args.prefix_block is not None and not args.prefix_cache_gb:
        raise UserError("--prefix-block sizes the prefix cache's entries: give --prefix-cache-gb "
                        "too, or drop it")
    return args.prefix_block or PREFIX_BLOCK


def is_unicode(text: str) -> bool:
    """Whether `text` is Unicode a tokenizer takes: JSON's escapes (and argv's undecodable
    bytes) can put a lone surrogate such as \\ud800 into a Python str."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# the Engine arguments of `engine_settings` whose names the engine's errors use -> their flags
ENGINE_FLAGS = {"num_slots": "--num-slots", "max_len": "--max-len", "num_draft": "--num-draft",
                "steps_per_visit": "--steps-per-visit", "prefix_cache_gb": "--prefix-cache-gb",
                "prefix_block": "--prefix-block", "prefix_host_gb": "--prefix-cache-host-gb"}


def engine_error(e: Exception) -> UserError:
    """The engine's refusal of the settings (a ValueError naming its arguments, e.g.
    "prefix_block must be ...") as a one-line UserError naming the flags instead."""
    text = " ".join(str(e).split())
    return UserError(re.sub(r"\b(" + "|".join(ENGINE_FLAGS) + r")\b",
                            lambda m: ENGINE_FLAGS[m[1]], text))


def add_batching_argument(ap):
    """--dynamic-batch: `Engine(batch_invariant=False)`."""
    ap.add_argument("--dynamic-batch", action="store_true",
                    help="steps run only the occupied slots and prefill only the prompts that "
                         "arrived (much faster at low load); by default decode steps have the "
                         "same shapes at any load and round the same (with --dynamic-batch "
                         "rounding also depends on the batch size, so greedy near-ties differ "
                         "between loads more often)")


PREFIX_BLOCK = 64


def add_prefix_arguments(ap):
    """--prefix-cache-gb / --prefix-block / --prefix-cache-host-gb: the engine's prefix cache
    (`Engine(prefix_cache_gb=, prefix_block=, prefix_host_gb=)`)."""
    ap.add_argument("--prefix-cache-gb", type=number(0, note=" (0 = off)"), default=0.0,
                    metavar="GB", help="device memory for cached prompt prefixes: requests that "
                                       "start with a cached prefix prefill only the rest "
                                       "(default 0: off)")
    ap.add_argument("--prefix-block", type=window_multiple, default=None, metavar="B",
                    help="tokens per prefix-cache entry, a power of two >= --window; a hit "
                         "takes every shared token, whole blocks copied and the rest replayed "
                         f"(default {PREFIX_BLOCK})")
    ap.add_argument("--prefix-cache-host-gb", type=number(0, note=" (0 = off)"), default=0.0,
                    metavar="GB", help="host memory the prefix cache spills evicted entries to "
                                       "(a later hit copies them back; default 0: dropped)")


def window_multiple(text):
    """argparse type: a power of two >= 1 (a prefix-cache block; >= the window is the
    engine's check)."""
    v = _int(text)
    if v < 1 or v & (v - 1) or v > INT32_MAX:
        raise argparse.ArgumentTypeError(f"must be a power of two, got {v}")
    return v


def add_tp_argument(ap):
    """--tp N: the tensor-parallel degree, --expert-parallel: how MoE experts split
    (`tp_placement`)."""
    ap.add_argument("--tp", type=at_least(1), default=1, metavar="N",
                    help="tensor-parallel degree: the model split over N devices (this host's "
                         "GPUs, or one per process under `replayjax launch`; default 1)")
    ap.add_argument("--expert-parallel", action="store_true",
                    help="with --tp N: each device holds 1/N of a MoE layer's experts, whole, "
                         "and runs only the tokens routed to them (default: 1/N of every "
                         "expert's width)")


def expert_split(args) -> str:
    """The `models.sharding.TPRules` expert split of --expert-parallel ("experts") or not
    ("width"); UserError when it is given without --tp N > 1."""
    if args.expert_parallel and args.tp == 1:
        raise UserError("--expert-parallel: needs --tp N > 1 (the experts split over N devices)")
    return "experts" if args.expert_parallel else "width"


def tp_placement(args):
    """(mesh, experts) of --tp and --expert-parallel: `tp_mesh` and `expert_split`."""
    return tp_mesh(args.tp), expert_split(args)


def check_tp(flag: str, tp: int, cfg, experts: str = "width"):
    """UserError naming `flag` unless tp devices are visible and tp divides the model's head
    counts (and expert count or width, as `experts` splits them; cheap: before loading
    anything)."""
    from models.sharding import check_tp as check_counts
    tp_mesh(tp)
    try:
        check_counts(cfg, tp, experts)
    except ValueError as e:
        raise UserError(f"{flag} {tp}: {e}") from None


def tp_mesh(tp: int):
    """The tensor-parallel mesh of --tp (None for 1): UserError when the visible devices are
    fewer than tp."""
    if tp == 1:
        return None
    from models.sharding import make_mesh
    try:
        return make_mesh(tp)
    except ValueError as e:
        raise UserError(f"--tp {tp}: {e}") from None


# ---------------------------------------------------------------------- progress

def interactive(args) -> bool:
    """Progress is for people watching: not with --json (or --jsonl), not into a pipe or file."""
    return not (getattr(args, "json", False) or getattr(args, "jsonl", False)) \
        and sys.stderr.isatty()


def log_stages() -> bool:
    """REPLAYJAX_LOG_STAGES=1: a batch job's log gets a plain line per stage (`Progress`)."""
    return os.environ.get("REPLAYJAX_LOG_STAGES") == "1"


class Progress:
    """A terminal progress line over named stages (tqdm, on stderr, cleared when closed); silent
    unless `enabled`. While a stage runs, the elapsed time keeps ticking (a compile can take
    minutes) and `note` shows how far the stage is. Not enabled, with REPLAYJAX_LOG_STAGES=1
    set (a batch job's log), each stage writes plain lines on stderr as it starts and ends."""

    def __init__(self, total: int, enabled: bool):
        from tqdm import tqdm
        self._log = not enabled and log_stages()
        self.bar = tqdm(total=total, disable=not enabled, file=sys.stderr, leave=False,
                        bar_format="{desc} [{n_fmt}/{total_fmt}, {elapsed}]{postfix}")
        self._stop = threading.Event()
        self._ticker = None
        if enabled:
            self._ticker = threading.Thread(target=self._tick, daemon=True)
            self._ticker.start()

    def _tick(self):
        while not self._stop.wait(1.0):
            self.bar.refresh()

    @contextlib.contextmanager
    def stage(self, text: str):
        self.bar.set_description_str(text, refresh=False)
        self.bar.set_postfix_str("", refresh=False)
        self.bar.refresh()
        start = time.perf_counter()
        if self._log:
            print(f"{text} ...", file=sys.stderr, flush=True)
        yield
        self.bar.update(1)
        if self._log:
            print(f"{text}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)

    def note(self, text: str):
        self.bar.set_postfix_str(text)

    def close(self):
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        self.bar.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
