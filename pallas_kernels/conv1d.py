"""Causal depthwise conv1d for decode and verify windows, with exact rollback (pure jnp).

The conv state of a slot holds the last K - 1 pre-conv inputs. A verify window of T tokens is
convolved against state + window without changing the state; `conv_commit` then keeps the last
K - 1 inputs of state + window[0:n_accepted], exactly as if only the accepted tokens had run.
"""

from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels._common import NULL_SLOT, row_index


def conv_window(conv_state, window, weight, bias, slots):
    """conv_state [S, K-1, C]; window [b, T, C]; weight [C, K] (last tap = current token);
    bias [C] or None; slots [b]. Returns the pre-activation outputs [b, T, C] in float32."""
    K = weight.shape[1]
    T = window.shape[1]
    seq = jnp.concatenate([conv_state[slots].astype(jnp.float32),
                           window.astype(jnp.float32)], axis=1)          # [b, K-1+T, C]
    w = weight.astype(jnp.float32)
    out = sum(seq[:, k:k + T] * w[:, k] for k in range(K))
    return out if bias is None else out + bias.astype(jnp.float32)


def conv_commit(conv_state, window, slots, n_accepted):
    """New state = the last K-1 inputs of state + window[0:n_accepted] (n clamped to [1, T]).
    NULL_SLOT rows change nothing. Returns the updated pool [S, K-1, C]."""
    Km1, T = conv_state.shape[1], window.shape[1]
    seq = jnp.concatenate([conv_state[slots], window.astype(conv_state.dtype)], axis=1)
    n = jnp.clip(n_accepted, 1, T)
    idx = n[:, None] + jnp.arange(Km1)[None, :]                            # [b, K-1]
    new = jnp.take_along_axis(seq, idx[:, :, None], axis=1)
    live = slots != NULL_SLOT
    return conv_state.at[row_index(slots, live, conv_state.shape[0])].set(new, mode="drop")
