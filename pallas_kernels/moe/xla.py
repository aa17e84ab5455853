"""Sparse routed experts in plain XLA (the CPU / CI path): a loop over the used tiles of a
`DispatchPlan`, each one [m, din] x [din, F] product with its expert's weights sliced out (never
gathered into a [tiles, din, F] copy), the activation, the [m, F] x [F, din] product and the
routing weight. The loop's trip count is the number of used tiles, a runtime value: work and
weight bytes follow the distinct experts hit, not E, and padding rows cost nothing. Tiles of a
shared expert's chunks (experts E ...) slice its column chunk instead.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from pallas_kernels.moe.plan import DispatchPlan, combine, num_used_tiles
from pallas_kernels.moe.reference import F32, activate, precision


def expert_ffn(x, plan: DispatchPlan, w_up, w_down, w_gate, shared, activation: str,
               block_m: int):
    """x [n, din]; weights as `pallas_kernels.moe.expert_ffn`. Returns [n, din] in x.dtype."""
    m, din, dt = block_m, x.shape[1], w_up.dtype
    hi, xe = precision(dt), x.astype(dt)
    mm = lambda a, w: jnp.dot(a, w, precision=hi, preferred_element_type=F32)
    E, F = w_up.shape[0], w_up.shape[2]

    def matrices(e):
        """(W_up, W_down, W_gate or None) of expert e: [din, F], [F, din], [din, F]."""
        routed = lambda: (w_up[e], w_down[e], None if w_gate is None else w_gate[e])
        if shared is None:
            return routed()
        cols = lambda w, axis: lax.dynamic_slice_in_dim(w, (e - E) * F, F, axis)
        chunk = lambda: (cols(shared.w_up, 1), cols(shared.w_down, 0),
                         None if w_gate is None else cols(shared.w_gate, 1))
        return lax.cond(e < E, routed, chunk)

    def tile(t, rows):
        e, r0 = plan.tile_expert[t], t * m
        up, down, gate = matrices(e)
        xt = xe[lax.dynamic_slice_in_dim(plan.row_token, r0, m)]                  # [m, din]
        hid = activate(mm(xt, up), None if gate is None else mm(xt, gate), activation)
        wt = lax.dynamic_slice_in_dim(plan.row_weight, r0, m)
        return lax.dynamic_update_slice_in_dim(rows, mm(hid.astype(dt), down) * wt[:, None],
                                               r0, axis=0)

    rows = jnp.zeros((plan.row_token.shape[0], din), F32)
    rows = lax.fori_loop(0, num_used_tiles(plan), tile, rows)
    return combine(rows, plan.pair_row).astype(x.dtype)
