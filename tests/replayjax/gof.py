"""Goodness-of-fit helpers for the sampling tests: an independent float64 numpy statement of the
target distribution (temperature, then top-k, then top-p on the renormalised top-k mass), and a
G-test (likelihood-ratio chi-square) of observed token counts against expected ones.

Every check runs at ALPHA = 1e-9 and a test makes at most ~100 checks, so a correct sampler
fails a test with probability < 1e-6. Cells are pooled until each expects >= 20 draws; there the
chi-square tail of G is accurate at such levels (for two pools and n = 40..5000 draws the exact
binomial probability of exceeding the 1e-9 critical value is 0.8e-9..2.1e-9). Draws from
different distributions (`rank_cells`) have at most multinomial variance, so the test stays
conservative. Tokens a filter removes must never be drawn: that is asserted exactly.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

ALPHA = 1e-9
MIN_EXPECTED = 20.0
# rank groups of the heterogeneous test: ranks 0, 1, 2, 3, 4-5, 6-9, 10-15, 16-31, 32+
RANK_EDGES = np.array([0, 1, 2, 3, 4, 6, 10, 16, 32])


def target_probs(logits, temperature, top_k, top_p, *, margin=1e-5):
    """The distribution a sampler must draw from, in float64. logits [n, V] (any float dtype);
    temperature [n] (> 0); top_k [n] (0 = off); top_p [n] (1 = off). Returns (probs [n, V]
    float64, ambiguous [n] bool): a row is ambiguous when a filter's boundary lies within
    `margin` of a kept token (top-p mass or top-k logit tie), where fp32 rounding on the device
    may legitimately decide otherwise; callers drop such rows (a choice made from the logits
    alone, so the remaining draws keep their distribution)."""
    logits = np.asarray(logits, np.float32)
    n, V = logits.shape
    temperature = np.broadcast_to(np.asarray(temperature, np.float32), (n,))
    top_k = np.broadcast_to(np.asarray(top_k), (n,))
    top_p = np.broadcast_to(np.asarray(top_p, np.float64), (n,))
    z = (logits / temperature[:, None]).astype(np.float64)    # fp32 division, as on the device
    order = np.argsort(-z, axis=1, kind="stable")
    srt = np.take_along_axis(z, order, axis=1)
    rank = np.arange(V)[None, :]
    k = np.where(top_k > 0, np.minimum(top_k, V), V)
    keep = rank < k[:, None]
    kth = np.take_along_axis(srt, (k - 1)[:, None], axis=1)
    nxt = np.take_along_axis(srt, np.minimum(k, V - 1)[:, None], axis=1)
    ambiguous = (k < V) & (np.abs(kth - nxt)[:, 0] < margin)
    p = np.where(keep, np.exp(srt - srt[:, :1]), 0.0)
    p /= p.sum(1, keepdims=True)
    before = np.cumsum(p, axis=1) - p                          # mass ahead of each token
    keep &= before < top_p[:, None]
    ambiguous |= (top_p < 1) & np.any((rank > 0) & (rank < k[:, None])
                                      & (np.abs(before - top_p[:, None]) < margin), axis=1)
    p = np.where(keep, p, 0.0)
    p /= p.sum(1, keepdims=True)
    probs = np.zeros_like(p)
    np.put_along_axis(probs, order, p, axis=1)
    return probs, ambiguous


def g_test(observed, expected, min_expected=MIN_EXPECTED):
    """G-test of counts observed [c] against expected [c] (equal totals). Cells are pooled in
    increasing order of expectation until each pool expects >= min_expected (a partition fixed
    by the expectations alone). Returns (G, degrees of freedom, p-value); p = 1 with < 2 pools."""
    o = np.asarray(observed, np.float64)
    e = np.asarray(expected, np.float64)
    assert abs(o.sum() - e.sum()) <= 1e-6 * max(e.sum(), 1.0), (o.sum(), e.sum())
    pools_o, pools_e, acc_o, acc_e = [], [], 0.0, 0.0
    for i in np.argsort(e, kind="stable"):
        acc_o, acc_e = acc_o + o[i], acc_e + e[i]
        if acc_e >= min_expected:
            pools_o.append(acc_o)
            pools_e.append(acc_e)
            acc_o = acc_e = 0.0
    if pools_e:                                   # a short remainder joins the last pool
        pools_o[-1] += acc_o
        pools_e[-1] += acc_e
    if len(pools_e) < 2:
        return 0.0, 0, 1.0
    po, pe = np.asarray(pools_o), np.asarray(pools_e)
    g = 2.0 * np.sum(np.where(po > 0, po * np.log(np.where(po > 0, po, 1.0) / pe), 0.0))
    df = len(pe) - 1
    return float(g), df, float(stats.chi2.sf(g, df))


def assert_fits(observed, expected, what):
    """The G-test accepts observed against expected at ALPHA; `what` names the check."""
    g, df, p = g_test(observed, expected)
    assert p > ALPHA, (f"{what}: token counts do not follow the target distribution "
                       f"(G = {g:.1f}, df = {df}, p = {p:.2e})\n observed {np.round(observed, 1)}"
                       f"\n expected {np.round(expected, 1)}")


def assert_never_filtered(probs, tokens, what):
    """Every drawn token has positive target probability. probs [n, V], tokens [n]."""
    p = probs[np.arange(len(tokens)), tokens]
    bad = np.flatnonzero(p <= 0)
    assert bad.size == 0, (f"{what}: {bad.size} of {len(tokens)} draws are tokens the filters "
                           f"remove (e.g. token {tokens[bad[0]]} in row {bad[0]})")


def rank_cells(probs, tokens, drafts=None):
    """Counts for draws from different distributions. probs [n, V] float64 (each draw's target),
    tokens [n], drafts [n] (the draft proposed at that position, -1 = none) or None. Each draw's
    vocabulary is partitioned before the draw into: its draft token (cell 0), then the other
    tokens by decreasing probability in the rank groups of RANK_EDGES. Returns (observed [c],
    expected [c]): the expectation of a cell is the sum over draws of its probability mass."""
    n, V = probs.shape
    rows = np.arange(n)
    drafts = np.full(n, -1) if drafts is None else np.asarray(drafts)
    has = drafts >= 0
    q = probs.copy()
    q[rows[has], drafts[has]] = -1.0                          # the draft ranks last, own cell
    order = np.argsort(-q, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(V)[None, :].repeat(n, 0), axis=1)
    cell = 1 + np.searchsorted(RANK_EDGES, rank, side="right") - 1
    cell[rows[has], drafts[has]] = 0
    c = len(RANK_EDGES) + 1
    expected = np.bincount(cell.ravel(), weights=probs.ravel(), minlength=c)
    observed = np.bincount(cell[rows, tokens], minlength=c).astype(np.float64)
    return observed, expected

