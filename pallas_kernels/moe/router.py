"""MoE routing as one op: router logits, scores, top-k selection and weights.

    ids, weights = route(x, gate, bias=None, *, top_k, score="softmax", norm_topk_prob=True,
                         scaling=1.0, n_group=1, topk_group=1, shared_chunks=0,
                         shared_gate=None)

x [n, D] float; gate [E, D] float32; bias [E] float32 or None. Returns expert ids [n, k + C]
int32 (best first; ties between selection scores go to the lowest expert index, as `lax.top_k`)
and weights [n, k + C] float32:
  * logits z = x . gate^T in float32; scores s = softmax(z) over E (Qwen) or sigmoid(z)
    (Nemotron-H);
  * experts chosen on s + bias (the bias selects, it never weighs), with n_group > 1 only inside
    the topk_group groups of E / n_group experts whose two best biased scores sum highest;
  * weights s at the chosen experts, divided by their sum (+ 1e-20 for sigmoid scores) if
    norm_topk_prob, times scaling;
  * then C = shared_chunks columns (0 by default): a shared expert's F-wide chunks as experts
    E ... E + C - 1 (`pallas_kernels.moe.expert_ffn`'s `shared`), every token routed to all of
    them with weight 1, or, given shared_gate [D] (any float dtype), sigmoid(x . shared_gate)
    (`shared_scale`: the float32 sum of products rounded to that dtype, the sigmoid too; Qwen's
    shared_expert_gate). Neither normalised nor scaled. The router kernel writes them in its
    launch, so a decode step needs no concatenation and no launch of its own for the gate.

impl: "xla" (any shape: the models' routers as they always were), "pallas" (a Pallas kernel,
one program per token: the scores, top-k as k rounds of argmax (lowest index on ties), the
weights; n_group 1, E a power of two, top_k <= MAX_TOP_K), "auto": once `AUTO` is set, the
kernel on a GPU for at most MAX_TOKENS tokens where it applies (a decode step: at batch 1 the
XLA routing is five launches, ~10-15 us of a 68-121 us layer on an H200), XLA elsewhere.

The logits (`RouterTiling.logits`): "kernel" computes them in the same launch, as broadcast
products summed over D chunks, so each token's program reads the whole gate (1.4-4 MB at the
models' shapes) alone; "xla" (the default: timed ~100x faster on an H200) leaves them to XLA's
GEMM, which spreads that read over the GPU: two launches.

Rounding: "kernel" computes every logit as exact float32 products and float32 sums, in another
order than XLA's HIGHEST-precision einsum (D-chunked partial sums): logits agree to a few
float32 ulps of sum |x_d g_ed|, and so do the weights (a softmax weight's relative error is its
logits' absolute one; 1e-6 relative in the tests); ids are equal unless two scores are that
close without being equal. Equal scores (equal gate rows, or x = 0) come out equal in both, so
ties resolve alike. With "xla" the logits are XLA's own and only the sums over E and over the
chosen k round differently. The shared gate's sum too is the kernel's own: in float32 a few ulps
from XLA's, then rounded to shared_gate's dtype (in bfloat16 one ulp apart where the sum lands
next to a rounding boundary).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels._kernel_utils import F32, compiler_params, n_chunks
from pallas_kernels.dispatch import Op, resolve_impl
from pallas_kernels.validation import (
    FLOAT_DTYPES,
    bounded_block,
    check,
    check_array,
    check_dtype,
    check_nonempty,
    check_shape,
    is_int,
    is_pow2,
    resolve_tiling,
)

SCORES = ("softmax", "sigmoid")
# "auto" takes the kernel (logits from XLA's GEMM) up to this many tokens a call, as far as it
# was timed. H200, `gpu_session.sh moe-router` (seventh session): at batch 1 the kernel routes in
# one 3.6 us launch where XLA's routing took ~7 fusions and ~40 us (Qwen3.5-35B); with the shared
# expert in the routed launch the layer went 82 -> 50 us, and it was faster at 8 and 32 tokens
# for all three MoE models. Compiled tests pass on the H200.
MAX_TOKENS = 32
AUTO = True
MAX_TOP_K = 16          # the kernel's k argmax rounds are unrolled
_NORM_EPS = {"softmax": 0.0, "sigmoid": 1e-20}      # HF's routers: only Nemotron-H adds one


@dataclasses.dataclass(frozen=True)
class RouterTiling:
    """The router kernel's launch: logits "kernel" (in the launch: each program reads gate
    [E, D] in [E, block_d] tiles, block_d the largest power of two dividing D with
    E block_d <= tile_elems) or "xla" (XLA's einsum, as `route_xla`, before the kernel);
    warps and stages."""
    tile_elems: int
    num_warps: int
    num_stages: int = 3
    logits: str = "xla"


# The logits stay XLA's: in the kernel, one program per token streaming the whole gate alone took
# 270-570 us at batch 1 on the H200 (`bench moe --router-tilings '[{}, {"logits": "kernel"}]'`)
# against XLA's GEMM + the kernel's 3.6 us; 4096-element tiles keep 32 float32 registers a thread
# at 4 warps.
TILING = RouterTiling(tile_elems=4096, num_warps=4, num_stages=3, logits="xla")
LOGITS = ("kernel", "xla")


def route(x, gate, bias=None, *, top_k: int, score: str = "softmax", norm_topk_prob=True,
          scaling: float = 1.0, n_group: int = 1, topk_group: int = 1, shared_chunks: int = 0,
          shared_gate=None, impl="auto", tiling=None, interpret=None):
    """Expert ids [n, k + C] int32 and weights [n, k + C] float32 of x [n, D] (module
    docstring; C = shared_chunks)."""
    n, E = _check(x, gate, bias, top_k, score, n_group, topk_group)
    _check_shared(shared_chunks, shared_gate, x.shape[1])
    backend = pick_backend(impl, n, E, top_k, n_group)
    if backend != "xla":
        check(n_group == 1, f"group-limited routing (n_group = {n_group}) has no Pallas kernel")
        check(is_pow2(E), f"the router kernel needs a power-of-two expert count, got E = {E}")
        check(top_k <= MAX_TOP_K, f"the router kernel takes top_k <= {MAX_TOP_K}, got {top_k}")
    return _ROUTE(x, gate, bias, top_k, score, bool(norm_topk_prob), float(scaling), n_group,
                  topk_group, int(shared_chunks), shared_gate, impl=backend, tiling=tiling,
                  interpret=interpret)


def pick_backend(impl: str, n: int, num_experts: int, top_k: int, n_group: int = 1) -> str:
    """The backend `route` runs for n tokens: `impl` resolved, except that "auto" keeps XLA
    until `AUTO` is set, above MAX_TOKENS tokens and for routings the kernel does not take
    (module docstring)."""
    backend = resolve_impl(impl)
    fits = n_group == 1 and is_pow2(num_experts) and top_k <= MAX_TOP_K
    return "xla" if impl == "auto" and not (AUTO and fits and n <= MAX_TOKENS) else backend


def _check(x, gate, bias, top_k, score, n_group, topk_group):
    check(score in SCORES, f"score must be one of {SCORES}, got {score!r}")
    check_array("x", x)
    check_array("gate", gate)
    check(x.ndim == 2, f"x must be [tokens, D], got shape {tuple(x.shape)}")
    check(gate.ndim == 2, f"gate must be [experts, D], got shape {tuple(gate.shape)}")
    check_nonempty("x", x)
    check_nonempty("gate", gate)
    n, D = x.shape
    E = gate.shape[0]
    check_shape("gate", gate, (E, D))
    check_dtype("x", x, FLOAT_DTYPES)
    check_dtype("gate", gate, (F32,))
    if bias is not None:
        check_shape("bias", bias, (E,))
        check_dtype("bias", bias, (F32,))
    check(n_group >= 1 and E % n_group == 0,
          f"n_group = {n_group} must divide the expert count E = {E}")
    check(1 <= topk_group <= n_group, f"topk_group = {topk_group} must be in [1, n_group = "
                                      f"{n_group}]")
    eligible = topk_group * (E // n_group)
    check(1 <= top_k <= eligible, f"top_k = {top_k} must be in [1, {eligible}] (the experts of "
                                  f"topk_group = {topk_group} of n_group = {n_group} groups)")
    return n, E


def _check_shared(chunks, shared_gate, D):
    check(is_int(chunks) and chunks >= 0, f"shared_chunks = {chunks!r} must be an integer >= 0")
    if shared_gate is not None:
        check(chunks >= 1, "shared_gate needs shared_chunks >= 1 (the columns it weighs)")
        check_array("shared_gate", shared_gate)
        check_shape("shared_gate", shared_gate, (D,))
        check_dtype("shared_gate", shared_gate, FLOAT_DTYPES)


def _scores(logits, score):
    return jax.nn.softmax(logits, axis=-1) if score == "softmax" else jax.nn.sigmoid(logits)


def _logits(x, gate):
    """x [n, D] -> float32 logits [n, E] (gate [E, D] float32)."""
    return jnp.einsum("nd,ed->ne", x.astype(F32), gate, precision=lax.Precision.HIGHEST)


def shared_scale(x, shared_gate):
    """sigmoid(x . shared_gate) float32 of x [..., D], shared_gate [D] -> [...]: the logit as a
    Linear in shared_gate's dtype computes it (float32 sums, rounded to that dtype), its sigmoid
    in float32 rounded to that dtype too, as torch's sigmoid of a bfloat16 tensor (Qwen's
    shared_expert_gate; XLA's own bfloat16 sigmoid rounds each of its steps)."""
    g = shared_gate
    z = jnp.einsum("...d,d->...", x.astype(g.dtype), g,
                   precision=lax.Precision.HIGHEST if g.dtype == F32 else None)
    return jax.nn.sigmoid(z.astype(F32)).astype(g.dtype).astype(F32)


def _with_shared(ids, w, x, num_experts, chunks, shared_gate):
    """ids, w [n, k] with the C = chunks shared columns appended (module docstring)."""
    if not chunks:
        return ids, w
    n = ids.shape[0]
    scale = (jnp.ones((n,), F32) if shared_gate is None else shared_scale(x, shared_gate))
    chunk_ids = num_experts + jnp.arange(chunks, dtype=jnp.int32)
    return (jnp.concatenate([ids, jnp.broadcast_to(chunk_ids, (n, chunks))], axis=1),
            jnp.concatenate([w, jnp.broadcast_to(scale[:, None], (n, chunks))], axis=1))


def route_xla(x, gate, bias, top_k, score, norm_topk_prob, scaling, n_group, topk_group,
              shared_chunks, shared_gate):
    """The routing in XLA: HIGHEST-precision einsum logits, `lax.top_k` selection."""
    s = _scores(_logits(x, gate), score)
    sel = s if bias is None else s + bias
    if n_group > 1:     # keep the topk_group groups with the largest sum of their top-2
        grp = sel.reshape(sel.shape[:-1] + (n_group, -1))
        best = lax.top_k(grp, min(2, grp.shape[-1]))[0].sum(-1)                  # [n, n_group]
        keep = jax.nn.one_hot(lax.top_k(best, topk_group)[1], n_group, dtype=bool).any(-2)
        sel = jnp.where(jnp.repeat(keep, grp.shape[-1], axis=-1), sel, -jnp.inf)
    _, ids = lax.top_k(sel, top_k)
    w = jnp.take_along_axis(s, ids, axis=-1)
    if norm_topk_prob:
        w = w / (w.sum(-1, keepdims=True) + _NORM_EPS[score])
    return _with_shared(ids.astype(jnp.int32), w * scaling, x, gate.shape[0], shared_chunks,
                        shared_gate)


def route_pallas(x, gate, bias, top_k, score, norm_topk_prob, scaling, n_group, topk_group,
                 shared_chunks, shared_gate, *, tiling, interpret):
    """The routing in a Pallas launch over grid (token,) (n_group 1), after XLA's logits GEMM
    for tiling logits "xla"; the shared columns in the same launch."""
    del n_group, topk_group                             # 1: checked by `route`
    t = resolve_tiling(tiling, TILING)
    E, D = gate.shape
    check(t.logits in LOGITS, f"logits must be one of {LOGITS}, got {t.logits!r}")
    fused = t.logits == "kernel"
    check(not fused or (is_pow2(t.tile_elems) and t.tile_elems >= E),
          f"tile_elems = {t.tile_elems} must be a power of two >= E = {E}")
    block_d = bounded_block("block_d", "D", D, t.tile_elems // E) if fused else None
    gated = shared_gate is not None
    # the shared gate's dot reads x in slices of at most 2048 (a power of two dividing D)
    gate_d = bounded_block("block_d", "D", D, 2048) if gated else None
    inputs = (x, gate) if fused else (_logits(x, gate),) + ((x,) if gated else ())
    return _route(inputs, () if bias is None else (bias,),
                  () if shared_gate is None else (shared_gate,), top_k=top_k, score=score,
                  norm_eps=_NORM_EPS[score] if norm_topk_prob else None, scaling=scaling,
                  block_d=block_d, shared_chunks=shared_chunks, gate_d=gate_d,
                  num_warps=t.num_warps, num_stages=t.num_stages, interpret=interpret)


def _first_max(v, index):
    """The largest value of v [E] and the lowest index where it is (`lax.top_k`'s tie rule)."""
    top = jnp.max(v)
    return top, jnp.min(jnp.where(v == top, index, v.shape[0]))


def _route_kernel(*refs, top_k, score, norm_eps, scaling, block_d, has_bias, shared_chunks,
                  gate_d):
    # x and gate (block_d None: the logits, then x if gate_d), the bias (if any), the shared
    # gate (if gate_d), the outs
    *ins, ids_ref, w_ref = refs
    g_ref = ins.pop() if gate_d else None
    bias = ins.pop()[...] if has_bias else None
    row = pl.program_id(0)
    x_ref = ins[0] if block_d else ins[1] if gate_d else None
    # the shared gate's loads first: their latency hides behind the top-k rounds
    scale = None if g_ref is None else _gate_scale(x_ref, g_ref, row, gate_d)
    if block_d is None:
        z = ins[0][row, :]
    else:
        gate_ref = ins[1]

        def dot(ds, acc):       # exact float32 products, summed over the chunk
            xs = x_ref[row, ds].astype(F32)
            return acc + jnp.sum(gate_ref[:, ds] * xs[None, :], axis=1)

        z = n_chunks(gate_ref.shape[1], block_d, dot, jnp.zeros(gate_ref.shape[:1], F32))
    s, E = _scores(z, score), z.shape[0]
    sel = s if bias is None else s + bias
    expert = lax.broadcasted_iota(jnp.int32, (E,), 0)
    ws = []
    for j in range(top_k):      # the best expert, then out of the running
        top, e = _first_max(sel, expert)
        ids_ref[row, j] = e
        # without a bias the score is the selection's maximum: one reduction a round fewer
        ws.append(top if bias is None else jnp.max(jnp.where(expert == e, s, -jnp.inf)))
        sel = jnp.where(expert == e, -jnp.inf, sel)
    total = functools.reduce(lambda a, b: a + b, ws)
    for j, w in enumerate(ws):
        w_ref[row, j] = (w if norm_eps is None else w / (total + norm_eps)) * scaling
    if shared_chunks:
        for c in range(shared_chunks):
            ids_ref[row, top_k + c] = jnp.int32(E + c)
            w_ref[row, top_k + c] = jnp.float32(1.0) if scale is None else scale


def _gate_scale(x_ref, g_ref, row, block_d):
    """sigmoid(x[row] . g) as `shared_scale`: float32 products and sum, rounded to g's dtype,
    the sigmoid rounded to it too."""
    dt = g_ref.dtype

    def dot(ds, acc):               # x in g's dtype first, as the Linear casts it
        xs = x_ref[row, ds].astype(dt).astype(F32)
        return acc + jnp.sum(xs * g_ref[ds].astype(F32))

    z = n_chunks(g_ref.shape[0], block_d, dot, jnp.float32(0.0))
    return jax.nn.sigmoid(z.astype(dt).astype(F32)).astype(dt).astype(F32)


@functools.partial(jax.jit, static_argnames=("top_k", "score", "norm_eps", "scaling", "block_d",
                                             "shared_chunks", "gate_d", "num_warps",
                                             "num_stages", "interpret"))
def _route(inputs, bias, shared_gate, *, top_k, score, norm_eps, scaling, block_d,
           shared_chunks, gate_d, num_warps, num_stages, interpret):
    """inputs (x [n, D], gate [E, D] float32), or (logits [n, E] float32,) for block_d None,
    then x [n, D] there if the shared gate is given; bias () or ([E] float32,); shared_gate ()
    or ([D] float,) -> ids [n, k + C] int32, weights [n, k + C] float32 (C = shared_chunks)."""
    n, cols = inputs[0].shape[0], top_k + shared_chunks
    return pl.pallas_call(
        functools.partial(_route_kernel, top_k=top_k, score=score, norm_eps=norm_eps,
                          scaling=scaling, block_d=block_d, has_bias=bool(bias),
                          shared_chunks=shared_chunks, gate_d=gate_d),
        grid=(n,),
        out_shape=(jax.ShapeDtypeStruct((n, cols), jnp.int32),
                   jax.ShapeDtypeStruct((n, cols), F32)),
        compiler_params=compiler_params(num_warps, num_stages, interpret),
        interpret=interpret, name="moe_route",
    )(*inputs, *bias, *shared_gate)


_ROUTE = Op("moe.route", {"xla": route_xla, "pallas_triton": route_pallas})
