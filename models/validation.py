"""Input checks of the model-level API: `HybridLM`'s prefill / decode / verify / commit (and
`Runner`'s, which run them before jitting), both families' `init_cache`, and model construction.
Bad input is a one-line ValueError (TypeError for an argument of the wrong kind) naming the
argument and the rule, never a deep JAX error, NaN logits or a silent change of meaning.

Two kinds of check:

- static checks read only shapes, dtypes and Python values (ranks, integer dtypes, batch sizes,
  a verify window against the cache's room), so they also run while a step is traced under jit;
- value checks read the arrays (token ids in the vocabulary, prompt lengths, slot ids, the room
  left in a slot), so they run only when every array they read is concrete: called with tracers
  (inside a jitted step, such as the engine's) they are skipped, and nothing here runs or syncs
  inside a traced step. `Runner`'s methods call them before their jitted step, on concrete
  arguments.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from models.cache import ModelCache, SSMCache
from pallas_kernels.ring import MAX_VERIFY_TOKENS, MAX_WINDOW, NULL_SLOT
from pallas_kernels.validation import FLOAT_DTYPES, STATE_DTYPES, is_concrete, is_int, is_pow2

SSM_MODES = ("replay", "standard")


# ----------------------------------------------------------------------------- settings


def _dtype_name(d) -> str:
    return jnp.dtype(d).name


def check_dtype(name: str, value, allowed, note: str = "") -> jnp.dtype:
    """`value` as a jnp.dtype, or a ValueError if it is not one of `allowed` (or no dtype)."""
    try:
        dt = jnp.dtype(value)
    except (TypeError, ValueError):
        dt = None
    if dt is None or dt not in [jnp.dtype(a) for a in allowed]:
        names = ", ".join(_dtype_name(a) for a in allowed)
        got = repr(value) if dt is None else dt.name
        raise ValueError(f"{name} must be one of {names}{note}, got {got}")
    return dt


def check_model_dtype(dtype) -> jnp.dtype:
    """The dtype a model is built in (its parameters and activations): a float dtype the kernels
    take (float64 would silently be float32 without jax_enable_x64)."""
    return check_dtype("dtype", dtype, FLOAT_DTYPES, " (the model's parameter dtype)")


def _int_setting(name: str, value, low: int, why: str = "") -> None:
    if not is_int(value):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}{why}, got {value}")


def check_cache_settings(num_slots, max_len, *, window, max_verify, ssm_mode, state_dtype,
                         ring_dtype, kv_dtype):
    """`init_cache`'s arguments (both families): num_slots >= 2 (slot 0 is the null slot),
    max_len >= 1, window a power of two in [1, MAX_WINDOW] (the ring length L, checked in either
    mode), max_verify in [1, MAX_VERIFY_TOKENS] and, in replay mode, <= window (a verify window
    fits the ring), state_dtype float32 / bfloat16, ring_dtype a float dtype, kv_dtype float32 /
    bfloat16 (the attention pools); the dtypes resolved (None = the family's default) before the
    call. Returns (state_dtype, ring_dtype, kv_dtype) as jnp.dtypes."""
    _int_setting("num_slots", num_slots, 2, " (the null slot 0 plus at least one sequence slot)")
    _int_setting("max_len", max_len, 1)
    if ssm_mode not in SSM_MODES:
        raise ValueError(f"ssm_mode must be one of {SSM_MODES}, got {ssm_mode!r}")
    if not (is_int(window) and 1 <= window <= MAX_WINDOW and is_pow2(window)):
        raise ValueError(f"window must be a power of two in [1, {MAX_WINDOW}] (the ReplaySSM ring "
                         f"length L), got {window!r}")
    top = MAX_VERIFY_TOKENS if ssm_mode == "standard" else min(MAX_VERIFY_TOKENS, window)
    if not (is_int(max_verify) and 1 <= max_verify <= top):
        why = ("" if ssm_mode == "standard" else
               f"; in replay mode a verify window must fit the ring, window = {window}")
        raise ValueError(f"max_verify must be an integer in [1, {top}] (the longest verify "
                         f"window, at most {MAX_VERIFY_TOKENS}{why}), got {max_verify!r}")
    return (check_dtype("state_dtype", state_dtype, STATE_DTYPES),
            check_dtype("ring_dtype", ring_dtype, FLOAT_DTYPES),
            check_dtype("kv_dtype", kv_dtype, STATE_DTYPES, " (the attention KV pools; the "
                        "default is the model's dtype)"))


# ----------------------------------------------------------------------------- cache facts


def ssm_layers(cache: ModelCache) -> list[SSMCache]:
    return [lc for lc in cache.layers if isinstance(lc, SSMCache)]


def num_drafts(cache: ModelCache) -> int:
    """Draft states per slot of a standard-mode cache (0 otherwise)."""
    return next((lc.num_drafts for lc in ssm_layers(cache)), 0)


def verify_room(cache: ModelCache) -> int:
    """The longest verify window the cache has buffers for: its SSM layers' pending width, 0
    for a cache built with max_verify = 1 (decode only); MAX_VERIFY_TOKENS without SSM
    layers."""
    layers = ssm_layers(cache)
    if not layers:
        return MAX_VERIFY_TOKENS
    return 0 if layers[0].pending is None else layers[0].pending.shape[1]


def check_mode(mode, cache: ModelCache) -> None:
    """A known mode, and no replay step on a standard-mode cache with drafts (its rings are
    one entry per slot and its pool is larger than the rings: the kernels would reject it)."""
    if mode not in SSM_MODES:
        raise ValueError(f"mode must be one of {SSM_MODES}, got {mode!r}")
    if mode == "replay" and num_drafts(cache):
        raise ValueError("this cache was built with ssm_mode='standard' (draft states, no "
                         "rings): run it with mode='standard'")


def check_draft_room(drafts: int, window_len: int) -> None:
    """A standard-mode window of window_len tokens needs that many draft states per slot."""
    if drafts < window_len:
        raise ValueError(
            f"standard-mode verify of T = {window_len} needs {window_len} draft states per slot, "
            f"the cache has {drafts}; build it with init_cache(..., ssm_mode='standard', "
            f"max_verify={window_len})")


def _check_window_room(cache: ModelCache, T: int, mode: str, what: str) -> None:
    """A verify window of T tokens (`what`: "verify window T" or "commit window_len") fits the
    cache's buffers."""
    if mode == "standard" and ssm_layers(cache):
        check_draft_room(num_drafts(cache), T)
    room = verify_room(cache)
    if room == 0:
        raise ValueError(f"{what} = {T} needs a cache with verify buffers; this one was built "
                         f"with max_verify = 1: build it with init_cache(..., max_verify={T})")
    if T > room:
        raise ValueError(f"{what} = {T} exceeds the cache's max_verify ({room}); build the cache "
                         f"with init_cache(..., max_verify={T})")


# ----------------------------------------------------------------------------- static checks


def _int_array(name: str, a, ndim: int, layout: str) -> None:
    if not (hasattr(a, "shape") and hasattr(a, "dtype")):
        raise TypeError(f"{name} must be an array {layout} (jax or numpy), got "
                        f"{type(a).__name__}")
    if len(a.shape) != ndim:
        raise ValueError(f"{name} must be {layout}, got shape {tuple(a.shape)}")
    if not jnp.issubdtype(a.dtype, jnp.integer):
        raise TypeError(f"{name} must have an integer dtype, got {jnp.dtype(a.dtype).name}")


def _tokens(tokens) -> tuple[int, int]:
    _int_array("tokens", tokens, 2, "[batch, T] of token ids")
    b, T = tokens.shape
    if b < 1:
        raise ValueError(f"tokens has batch {b}; need at least one row, got shape {(b, T)}")
    if T < 1:
        raise ValueError(f"tokens has T = {T} tokens per row; need at least one, got shape "
                         f"{(b, T)}")
    return b, T


def _rows(name: str, a, b: int) -> None:
    """A per-row integer array [b]."""
    _int_array(name, a, 1, f"[batch] (one per row, batch = {b})")
    if a.shape[0] != b:
        raise ValueError(f"{name} has shape {tuple(a.shape)}, expected ({b},) (one per row of "
                         f"tokens)")


# ----------------------------------------------------------------------------- value checks


def _concrete(*arrays) -> bool:
    """Every array readable here (`is_concrete`: under jit the values are unknown, and value
    checks are skipped)."""
    return all(a is None or is_concrete(a) for a in arrays)


@jax.jit
def _min_max(a):
    return jnp.stack([a.min(), a.max()])


def _token_values(tokens, vocab: int) -> None:
    """Token ids in [0, vocab); the range is reduced where the array lives (2 numbers come to
    the host), the offending position only looked up on failure."""
    if isinstance(tokens, np.ndarray):
        lo, hi = tokens.min(), tokens.max()
    else:
        lo, hi = np.asarray(_min_max(tokens))
    if lo < 0 or hi >= vocab:
        t = np.asarray(tokens)
        i, j = np.argwhere((t < 0) | (t >= vocab))[0]
        raise ValueError(f"tokens[{i}, {j}] = {t[i, j]} is not a token id: ids must be in "
                         f"[0, {vocab}) (the model's vocab_size)")


def _slot_values(slots, num_slots: int):
    """Slot ids in the pool, live ones (not the null slot) distinct; returns them on the host
    and the live-row mask."""
    s = np.asarray(slots)
    if (bad := np.flatnonzero((s < 0) | (s >= num_slots))).size:
        i = bad[0]
        raise ValueError(f"slots[{i}] = {s[i]} is outside the cache's pool [0, {num_slots})")
    live = s != NULL_SLOT
    ids, counts = np.unique(s[live], return_counts=True)
    if (counts > 1).any():
        raise ValueError(f"slots name slot {ids[counts > 1][0]} twice; rows must use distinct "
                         f"slots (padding rows use the null slot {NULL_SLOT})")
    return s, live


def _fits(cache: ModelCache, s, live, begin, end, what: str) -> None:
    """Live rows' slots go from `begin` to `end` [b] tokens: within the cache's max_len."""
    max_len = int(cache.max_len)
    if (bad := np.flatnonzero(live & (end > max_len))).size:
        i = bad[0]
        raise ValueError(f"row {i} (slot {s[i]}): {what} takes the slot from {begin[i]} to "
                         f"{end[i]} tokens, past the cache's max_len = {max_len}")


# ----------------------------------------------------------------------------- entry points


def check_prefill(model, cache: ModelCache, tokens, lengths, slots, starts=None) -> None:
    """`HybridLM.prefill_from`'s inputs: tokens [b, T] integer ids, lengths / slots / starts
    [b] integer; on concrete arrays ids in [0, vocab), slots in the pool, and for live rows
    lengths in [1, T], starts >= 0 and starts + lengths <= max_len."""
    b, T = _tokens(tokens)
    _rows("lengths", lengths, b)
    _rows("slots", slots, b)
    if starts is not None:
        _rows("starts", starts, b)
    if not _concrete(tokens, lengths, slots, starts):
        return
    _token_values(tokens, model.cfg.vocab_size)
    s, live = _slot_values(slots, cache.num_slots)
    n = np.asarray(lengths)
    if (bad := np.flatnonzero(live & ((n < 1) | (n > T)))).size:
        i = bad[0]
        raise ValueError(f"lengths[{i}] = {n[i]} must be in [1, T = {T}] (row {i}'s tokens, "
                         f"right-padded to T)")
    begin = np.zeros_like(n) if starts is None else np.asarray(starts)
    if (bad := np.flatnonzero(live & (begin < 0))).size:
        raise ValueError(f"starts[{bad[0]}] = {begin[bad[0]]} must be >= 0")
    _fits(cache, s, live, begin, begin + n, "the prefill")


def check_window(model, cache: ModelCache, tokens, slots, mode: str, what: str) -> None:
    """`decode` (what = "decode": T = 1) or `verify` (T <= the cache's room) inputs: tokens
    [b, T] integer ids, slots [b] integer; on concrete arrays ids in [0, vocab), slots in the
    pool, and each live slot's length + T <= max_len."""
    check_mode(mode, cache)
    b, T = _tokens(tokens)
    _rows("slots", slots, b)
    if what == "decode":
        if T != 1:
            raise ValueError(f"decode takes one token per row, tokens [batch, 1]; got shape "
                             f"{(b, T)} (verify takes windows)")
    else:
        _check_window_room(cache, T, mode, "verify window T")
    if not _concrete(tokens, slots, cache.lengths):
        return
    _token_values(tokens, model.cfg.vocab_size)
    s, live = _slot_values(slots, cache.num_slots)
    have = np.asarray(cache.lengths)[s]
    _fits(cache, s, live, have, have + T, f"a {what} window of T = {T}" if what == "verify"
          else "a decode step")


def check_greedy(cache: ModelCache, lengths, slots, num_tokens) -> None:
    """`Runner.greedy`'s num_tokens (an integer >= 1) and, on concrete arrays, room for the
    prompts plus num_tokens in each live slot (its prompts are checked by `check_prefill`)."""
    if not (is_int(num_tokens) and num_tokens >= 1):
        raise ValueError(f"num_tokens must be an integer >= 1, got {num_tokens!r}")
    if not (hasattr(lengths, "shape") and hasattr(slots, "shape") and _concrete(lengths, slots)):
        return                      # `check_prefill` names what is wrong with them
    n, s = np.asarray(lengths), np.asarray(slots)
    if n.shape == s.shape:
        _fits(cache, s, s != NULL_SLOT, n, n + num_tokens, f"greedy decoding of {num_tokens} "
              f"tokens after the prompt")


def check_commit(cache: ModelCache, slots, n_accepted, window_len, mode: str) -> None:
    """`commit`'s inputs: slots / n_accepted [b] integer, window_len an integer in [1, the
    cache's room] (the verify window's T); on concrete arrays slots in the pool and live rows'
    n_accepted in [1, window_len]."""
    check_mode(mode, cache)
    _int_array("slots", slots, 1, "[batch] of slot ids")
    b = slots.shape[0]
    _rows("n_accepted", n_accepted, b)
    if not (is_int(window_len) and window_len >= 1):
        raise ValueError(f"window_len must be an integer >= 1 (the verify window's T), got "
                         f"{window_len!r}")
    _check_window_room(cache, window_len, mode, "commit window_len")
    if not _concrete(slots, n_accepted):
        return
    s, live = _slot_values(slots, cache.num_slots)
    n = np.asarray(n_accepted)
    if (bad := np.flatnonzero(live & ((n < 1) | (n > window_len)))).size:
        i = bad[0]
        raise ValueError(f"n_accepted[{i}] = {n[i]} must be in [1, window_len = {window_len}]")
