"""Chunked prefill (Mamba-2 SSD, GDN WY/UT) against a token-by-token float64 numpy oracle.

Ragged right-padded batches (T = 70, lengths [70, 1, 33, 64]), chunk 16 and 64 (T is not a
multiple of either), with and without an initial state, G < H and Hv > Hk. Tolerance: relative
Frobenius error < 1e-5 on the outputs at valid positions and on the final states; outputs past
the length must be exactly 0. The oracle is fed the values the function sees (bf16 rounded).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.gdn import prepare_qk
from pallas_kernels.gdn import reference as gdn_ref
from pallas_kernels.gdn.prefill import chunk_gated_delta_rule
from pallas_kernels.mamba2 import reference as m2_ref
from pallas_kernels.mamba2.prefill import ssd_prefill
from tests.pallas_kernels.helpers import rel_err

F32, BF16 = jnp.float32, jnp.bfloat16
T, LENGTHS = 70, np.array([70, 1, 33, 64], np.int32)
TOL = 1e-5
f64 = lambda a: np.asarray(a, np.float64)


# ----------------------------------------------------------------------------- oracles

def m2_oracle_step(s, x, B, C, dt, A, D):
    """One float64 Mamba-2 step for all rows: s [b, H, P, N], x [b, H, P], B, C [b, G, N]."""
    r = x.shape[1] // B.shape[1]
    Bh, Ch = np.repeat(B, r, 1), np.repeat(C, r, 1)
    s = np.exp(dt * A)[..., None, None] * s + (dt[..., None] * x)[..., None] * Bh[:, :, None]
    return np.einsum("bhpn,bhn->bhp", s, Ch) + D[:, None] * x, s


def gdn_oracle_step(s, q, k, v, g, beta):
    """One float64 gated delta step for all rows: s [b, Hv, V, K], q, k [b, Hk, K], v [b, Hv, V]."""
    r = v.shape[1] // k.shape[1]
    qh, kh = np.repeat(q, r, 1), np.repeat(k, r, 1)
    s = np.exp(g)[..., None, None] * s
    d = beta[..., None] * (v - np.einsum("bhvk,bhk->bhv", s, kh))
    s = s + d[..., None] * kh[:, :, None]
    return np.einsum("bhvk,bhk->bhv", s, qh), s


def run_oracle(step, s, seq, consts, lengths):
    """Token-by-token over [b, T, ...] inputs; rows stop at their length. Returns out, state."""
    s, outs = f64(s), []
    seq, consts = [f64(a) for a in seq], [f64(a) for a in consts]
    for t in range(seq[0].shape[1]):
        o, new = step(s, *[a[:, t] for a in seq], *consts)
        live = t < lengths
        s = np.where(live[:, None, None, None], new, s)
        outs.append(np.where(live[:, None, None], o, 0))
    return np.stack(outs, 1), s


def check(out, state, ref_out, ref_state, lengths):
    out, state = np.asarray(out), np.asarray(state)
    assert out.dtype == np.float32 and state.dtype == np.float32
    valid = np.arange(out.shape[1])[None, :] < lengths[:, None]
    assert np.all(out[~valid] == 0)
    e_out, e_state = rel_err(out[valid], ref_out[valid]), rel_err(state, ref_state)
    assert e_out < TOL and e_state < TOL, (e_out, e_state)
    return e_out, e_state


# ----------------------------------------------------------------------------- problems

def mamba_problem(seed, *, b=4, H=4, G=2, P=8, N=16, act=F32, init=True, n=T):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((b, n, H, P)), act)
    B = jnp.asarray(rng.standard_normal((b, n, G, N)) * N ** -0.5, F32)
    C = jnp.asarray(rng.standard_normal((b, n, G, N)) * N ** -0.5, F32)
    dt = jnp.asarray(rng.uniform(0.005, 0.15, (b, n, H)), F32)
    A = jnp.asarray(-rng.uniform(0.37, 2.7, H), F32)
    D = jnp.asarray(rng.standard_normal(H), F32)
    s0 = jnp.asarray(rng.standard_normal((b, H, P, N)) * 0.5, F32) if init else None
    return (x, B, C, dt), (A, D), s0


def gdn_problem(seed, *, b=4, Hk=2, Hv=4, K=16, V=16, act=F32, init=True, n=T):
    rng = np.random.default_rng(seed)
    q, k = prepare_qk(jnp.asarray(rng.standard_normal((b, n, Hk, K)), F32),
                      jnp.asarray(rng.standard_normal((b, n, Hk, K)), F32))
    v = jnp.asarray(rng.standard_normal((b, n, Hv, V)), act)
    g = jnp.asarray(-np.exp(rng.uniform(np.log(0.005), np.log(0.5), (b, n, Hv))), F32)
    beta = jnp.asarray(1 / (1 + np.exp(-rng.standard_normal((b, n, Hv)))), F32)
    s0 = jnp.asarray(rng.standard_normal((b, Hv, V, K)) * 0.5, F32) if init else None
    return (q, k, v, g, beta), (), s0


def zeros_like_state(s0, shape):
    return np.zeros(shape) if s0 is None else s0


# ----------------------------------------------------------------------------- tests

@pytest.mark.parametrize("chunk", [16, 64])
@pytest.mark.parametrize("init", [False, True])
def test_ssd_prefill(chunk, init):
    seq, consts, s0 = mamba_problem(chunk + init, init=init)
    y, st = ssd_prefill(*seq, *consts, jnp.asarray(LENGTHS), s0, chunk=chunk)
    b, _, H, P = seq[0].shape
    ref = run_oracle(m2_oracle_step, zeros_like_state(s0, (b, H, P, seq[1].shape[-1])), seq,
                     consts, LENGTHS)
    check(y, st, *ref, LENGTHS)


@pytest.mark.parametrize("chunk", [16, 64])
@pytest.mark.parametrize("init", [False, True])
def test_chunk_gated_delta_rule(chunk, init):
    seq, _, s0 = gdn_problem(chunk + init, init=init)
    o, st = chunk_gated_delta_rule(*seq, jnp.asarray(LENGTHS), s0, chunk=chunk)
    b, _, Hv, V = seq[2].shape
    ref = run_oracle(gdn_oracle_step, zeros_like_state(s0, (b, Hv, V, seq[1].shape[-1])), seq,
                     (), LENGTHS)
    check(o, st, *ref, LENGTHS)


def _continue(step, oracle_step, state, ref_state, seq, consts, extra=3):
    """Decode `extra` tokens from the prefill state with the library step and the oracle."""
    for t in range(extra):
        tok = [a[:, t] for a in seq]
        o, state = step(state, *tok, *consts)
        ref_o, ref_state = oracle_step(ref_state, *map(f64, tok), *map(f64, consts))
        assert rel_err(o, ref_o) < TOL and rel_err(state, ref_state) < TOL


def test_ssd_prefill_then_decode():
    seq, consts, s0 = mamba_problem(7, n=T + 3)
    prompt = [a[:, :T] for a in seq]
    _, st = ssd_prefill(*prompt, *consts, jnp.asarray(LENGTHS), s0, chunk=16)
    # The oracle over the longer sequence: prompt[:length] then the 3 decode tokens.
    _, ref_st = run_oracle(m2_oracle_step, s0, prompt, consts, LENGTHS)
    _continue(m2_ref.ssm_step, m2_oracle_step, st, ref_st, [a[:, T:] for a in seq], consts)


def test_gdn_prefill_then_decode():
    seq, _, s0 = gdn_problem(7, n=T + 3)
    prompt = [a[:, :T] for a in seq]
    _, st = chunk_gated_delta_rule(*prompt, jnp.asarray(LENGTHS), s0, chunk=16)
    _, ref_st = run_oracle(gdn_oracle_step, s0, prompt, (), LENGTHS)
    _continue(gdn_ref.delta_step, gdn_oracle_step, st, ref_st, [a[:, T:] for a in seq], ())


def test_bf16_inputs():
    seq, consts, s0 = mamba_problem(11, act=BF16)
    y, st = ssd_prefill(*seq, *consts, jnp.asarray(LENGTHS), s0, chunk=64)
    check(y, st, *run_oracle(m2_oracle_step, s0, seq, consts, LENGTHS), LENGTHS)
    seq, _, s0 = gdn_problem(11, act=BF16)
    o, st = chunk_gated_delta_rule(*seq, jnp.asarray(LENGTHS), s0, chunk=64)
    check(o, st, *run_oracle(gdn_oracle_step, s0, seq, (), LENGTHS), LENGTHS)


def test_nan_padding_is_ignored():
    """Garbage (NaN) at padded positions must not reach the outputs or the final state."""
    pad = np.arange(T)[None, :] >= LENGTHS[:, None]
    poison = lambda a: jnp.where(pad.reshape(pad.shape + (1,) * (a.ndim - 2)), jnp.nan, a)
    seq, consts, s0 = mamba_problem(13)
    y, st = ssd_prefill(*map(poison, seq), *consts, jnp.asarray(LENGTHS), s0, chunk=16)
    check(y, st, *run_oracle(m2_oracle_step, s0, seq, consts, LENGTHS), LENGTHS)
    seq, _, s0 = gdn_problem(13)
    o, st = chunk_gated_delta_rule(*map(poison, seq), jnp.asarray(LENGTHS), s0, chunk=16)
    check(o, st, *run_oracle(gdn_oracle_step, s0, seq, (), LENGTHS), LENGTHS)


# ----------------------------------------------------------------------------- bad input

def _mamba_args(**changes):
    """ssd_prefill's arguments (b = 4, T = 70, H = 4, G = 2), with `changes` by name."""
    (x, B, C, dt), (A, D), s0 = mamba_problem(3)
    kw = dict(x=x, B=B, C=C, dt=dt, A=A, D=D, lengths=jnp.asarray(LENGTHS), initial_state=s0,
              chunk=16, block=0)
    return kw | changes


def _gdn_args(**changes):
    """chunk_gated_delta_rule's arguments (b = 4, T = 70, Hk = 2, Hv = 4), with `changes`."""
    (q, k, v, g, beta), _, s0 = gdn_problem(3)
    kw = dict(q=q, k=k, v=v, g=g, beta=beta, lengths=jnp.asarray(LENGTHS), initial_state=s0,
              chunk=16, block=0)
    return kw | changes


_LEN = lambda *v: jnp.asarray(v, jnp.int32)     # noqa: E731
# case: (changes, message); changes map argument names to values, or are a function of the
# valid arguments that returns them
BAD = {
    "chunk 0": (dict(chunk=0), r"^chunk = 0 must be an integer >= 1$"),
    "chunk float": (dict(chunk=16.0), r"^chunk = 16.0 must be an integer >= 1$"),
    "block not a multiple": (dict(chunk=4, block=6),
                             r"^block = 6 must be 0 or a positive multiple of chunk = 4$"),
    "block negative": (dict(block=-16), r"^block = -16 must be 0 or a positive multiple"),
    "length past T": (dict(lengths=_LEN(70, 1, 71, 3)), r"^lengths\[2\] = 71 is outside "
                                                         r"\[1, T = 70\]$"),
    "length 0": (dict(lengths=_LEN(70, 0, 3, 3)),
                 r"^lengths\[1\] = 0 is outside \[1, T = 70\]$"),
    "lengths batch": (dict(lengths=_LEN(70, 1, 3)),
                      r"^lengths has shape \(3,\), expected \(4,\)$"),
    "lengths dtype": (dict(lengths=jnp.asarray(LENGTHS, F32)),
                      r"^lengths has dtype float32, expected one of: int32$"),
    "state shape": (lambda a: dict(initial_state=a["initial_state"][..., :-1]),
                    r"^initial_state has shape \(4, .*\), expected \(4, .*\)$"),
}
MAMBA_BAD = {
    "heads not a multiple of groups": (
        lambda a: dict(x=a["x"][:, :, :3], A=a["A"][:3], D=a["D"][:3], dt=a["dt"][..., :3],
                       initial_state=None),
        r"^heads \(3\) must be a multiple of groups \(2\)$"),
    "A length": (lambda a: dict(A=a["A"][:3]), r"^A has shape \(3,\), expected \(4,\)$"),
    "C of another T": (lambda a: dict(C=a["C"][:, :69]),
                       r"^C has shape \(4, 69, 2, 16\), expected \(4, 70, 2, 16\)$"),
    "dt dtype": (lambda a: dict(dt=a["dt"].astype(BF16)),
                 r"^dt has dtype bfloat16, expected one of: float32$"),
    "batch 0": (lambda a: dict(x=a["x"][:0]),
                r"^x has shape \(0, 70, 4, 8\): every dimension must be >= 1"),
}
GDN_BAD = {
    "value heads": (lambda a: dict(v=a["v"][:, :, :3], g=a["g"][..., :3],
                                   beta=a["beta"][..., :3], initial_state=None),
                    r"^value heads \(3\) must be a multiple of key heads \(2\)$"),
    "v of another T": (lambda a: dict(v=a["v"][:, :69]),
                       r"^v has shape \(4, 69, 4, 16\), expected \(4, 70, \*, \*\)$"),
    "beta dtype": (lambda a: dict(beta=a["beta"].astype(BF16)), r"^beta has dtype bfloat16"),
    "T 0": (lambda a: dict(q=a["q"][:, :0]),
            r"^q has shape \(4, 0, 2, 16\): every dimension must be >= 1"),
}


@pytest.mark.parametrize("fn,make,case,changes,match", [
    pytest.param(fn, make, case, ch, m, id=f"{fn.__name__}-{case}")
    for fn, make, table in ((ssd_prefill, _mamba_args, BAD | MAMBA_BAD),
                            (chunk_gated_delta_rule, _gdn_args, BAD | GDN_BAD))
    for case, (ch, m) in table.items()])
def test_bad_input_is_named(fn, make, case, changes, match):
    """The prefill scans' arguments: chunking, lengths (concrete ones in [1, T]), every array
    through the family's Field table; one line naming the argument, before anything is traced
    (a block that is no multiple of chunk used to return the state after the wrong token)."""
    kw = make()
    kw |= changes(kw) if callable(changes) else changes
    with pytest.raises(ValueError, match=match) as e:
        fn(**kw)
    assert "\n" not in str(e.value)


def test_lengths_are_not_checked_under_jit():
    """Traced lengths are the caller's contract (the models' jitted prefill): no check, no
    error at trace time."""
    kw = _mamba_args(lengths=_LEN(99, 0, -3, 70))
    lengths = kw.pop("lengths")
    jax.eval_shape(lambda n: ssd_prefill(lengths=n, **kw), lengths)


def test_to_chunks_names_a_bad_chunk():
    from pallas_kernels.chunks import to_chunks
    with pytest.raises(ValueError, match=r"^chunk = 0 must be an integer >= 1$"):
        to_chunks(jnp.zeros((2, 8, 3)), jnp.ones((2, 8), bool), 0)
