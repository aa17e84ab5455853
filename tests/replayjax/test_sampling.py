"""Sampling and speculative acceptance rules. The goodness-of-fit tests draw tens of thousands of
rows in one call and compare the token counts with the target distribution stated independently
in tests/replayjax/gof.py (G-tests at 1e-9, filtered tokens never drawn): plain sampling with
temperature, top-k, top-p and both; rejection sampling against deterministic drafts, K = 1..4,
at every emitted position given the accepted prefix, bonus token included.
scripts/check_sampling_mutations.py shows these tests fail on broken samplers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from replayjax import sampling
from tests.replayjax import gof

V = 8
BASE = np.log([0.30, 0.22, 0.15, 0.11, 0.08, 0.06, 0.05, 0.03])
# (temperature, top_k, top_p): all at temperatures != 1; each filter removes 27-38% of the mass
CONFIGS = [(0.6, 0, 1.0), (1.7, 0, 1.0), (0.8, 3, 1.0), (1.4, 0, 0.7), (1.2, 4, 0.75)]


def _logits(rng, shape):
    """BASE under an independent random permutation per leading index: [*shape, V] fp32."""
    flat = [BASE[rng.permutation(V)] for _ in range(int(np.prod(shape)))]
    return np.asarray(flat, np.float32).reshape(*shape, V)


def _params(configs, n):
    """Per-row (temperature, top_k, top_p) [len(configs) * n], n rows per config."""
    t, k, p = (np.repeat([c[i] for c in configs], n) for i in range(3))
    return t.astype(np.float32), k.astype(np.int32), p.astype(np.float32)


def test_top_k_and_top_p_filters():
    logits = jnp.log(jnp.asarray([[0.5, 0.2, 0.15, 0.1, 0.05]] * 3))
    probs = sampling.filtered_probs(logits, jnp.ones(3), jnp.asarray([2, 0, 0]),
                                    jnp.asarray([1.0, 0.8, 1.0]))
    np.testing.assert_allclose(probs[0], [0.5 / 0.7, 0.2 / 0.7, 0, 0, 0], atol=1e-6)
    np.testing.assert_allclose(probs[1], np.array([0.5, 0.2, 0.15, 0, 0]) / 0.85, atol=1e-6)
    np.testing.assert_allclose(probs[2], [0.5, 0.2, 0.15, 0.1, 0.05], atol=1e-6)


def test_top_p_of_one_keeps_every_token():
    """top_p = 1 means no top-p filter, also when another row of the batch filters (sending the
    whole batch through the sort): no token of a vocabulary of 32000 may lose its probability
    (before the fix 80 tail tokens did, 3e-9 of the mass; at 131072 tokens 1824, 1e-7)."""
    logits = jax.random.normal(jax.random.key(0), (2, 32000)) * 3
    probs = sampling.filtered_probs(logits, jnp.ones(2), jnp.asarray([5, 0]), jnp.ones(2))
    assert int(jnp.sum(probs[1] == 0)) == 0


def test_greedy_acceptance_is_exact_match():
    V = 6
    logits = jax.nn.one_hot(jnp.asarray([[2, 4, 1, 5]]), V) * 10.0          # argmaxes 2, 4, 1, 5
    z = jnp.zeros(1)
    for drafts, want_n, want_new in (([2, 4, 1], 4, 5), ([2, 3, 1], 2, 4), ([0, 4, 1], 1, 2)):
        n, new = sampling.verify_drafts(logits, jnp.asarray([drafts]), z, jnp.zeros(1, jnp.int32),
                                        jnp.ones(1), jnp.zeros(1, jnp.int32),
                                        jnp.zeros(1, jnp.int32))
        assert int(n[0]) == want_n and int(new[0]) == want_new


def test_greedy_rows_do_not_depend_on_the_batch_sampling():
    """An all-greedy batch takes a cheaper branch (no sort, softmax or draws over the
    vocabulary); greedy rows inside a batch with sampling rows get the same tokens and the same
    acceptance, and unfiltered sampling rows draw from softmax(logits / T)."""
    b, T, V = 6, 4, 50
    logits = jax.random.normal(jax.random.key(0), (b, T, V)) * 3
    greedy = np.asarray(jnp.argmax(logits, -1))
    drafts = jnp.asarray(np.where(np.arange(T - 1) < np.arange(b)[:, None] % T, greedy[:, :T - 1],
                                  (greedy[:, :T - 1] + 1) % V), jnp.int32)
    mixed = jnp.asarray([0.0, 0.8, 0.0, 1.3, 0.0, 0.5])
    args = (jnp.zeros(b, jnp.int32), jnp.ones(b), jnp.arange(b, dtype=jnp.int32),
            jnp.full(b, 7, jnp.int32))
    n_all, new_all = sampling.verify_drafts(logits, drafts, jnp.zeros(b), *args)
    n_mix, new_mix = sampling.verify_drafts(logits, drafts, mixed, *args)
    g = np.asarray(mixed) == 0
    assert np.array_equal(np.asarray(n_all), np.arange(b) % T + 1)
    assert np.array_equal(np.asarray(n_all)[g], np.asarray(n_mix)[g])
    assert np.array_equal(np.asarray(new_all)[g], np.asarray(new_mix)[g])
    keys = jax.vmap(jax.random.key)(jnp.arange(b))
    tok_all = sampling.sample(logits[:, 0], jnp.zeros(b), *args[:2], keys)
    tok_mix = sampling.sample(logits[:, 0], mixed, *args[:2], keys)
    assert np.array_equal(np.asarray(tok_all), greedy[:, 0])
    assert np.array_equal(np.asarray(tok_mix)[g], greedy[g, 0])
    probs = sampling.filtered_probs(logits[:, 0], jnp.full(b, 0.7), jnp.zeros(b, jnp.int32),
                                    jnp.ones(b))
    np.testing.assert_allclose(probs, jax.nn.softmax(logits[:, 0] / 0.7), rtol=1e-6, atol=1e-7)


def test_sample_draws_from_the_filtered_distribution():
    """20000 draws per configuration (+ greedy rows, which must stay argmax under filters)."""
    n, rng = 20000, np.random.default_rng(0)
    configs = CONFIGS + [(0.0, 3, 0.7)]
    table = _logits(rng, (len(configs),))                       # [C, V]
    cfg = np.repeat(np.arange(len(configs)), n)
    temp, top_k, top_p = _params(configs, n)
    rows = len(cfg)
    keys = sampling.row_keys(jnp.arange(rows, dtype=jnp.int32), jnp.full(rows, 3, jnp.int32))
    tok = np.asarray(jax.jit(sampling.sample)(jnp.asarray(table[cfg]), jnp.asarray(temp),
                                              jnp.asarray(top_k), jnp.asarray(top_p), keys))
    assert np.all(tok[cfg == len(CONFIGS)] == np.argmax(table[-1]))
    probs, ambiguous = gof.target_probs(table[:-1], *zip(*CONFIGS))
    assert not ambiguous.any()
    for c, config in enumerate(CONFIGS):
        t = tok[cfg == c]
        what = f"sample, (temperature, top_k, top_p) = {config}"
        gof.assert_never_filtered(np.broadcast_to(probs[c], (n, V)), t, what)
        gof.assert_fits(np.bincount(t, minlength=V), n * probs[c], what)


@pytest.mark.parametrize("K", [1, 2, 3, 4])
def test_rejection_sampling_fits_every_position(K):
    """K deterministic drafts per row, per-position targets that differ (another permutation
    of BASE at every window position). The token emitted at position j (accepted draft d_{j+1},
    or the new token drawn at a rejection there, or the bonus token at j = K) must follow p_j
    over the rows whose first j drafts were accepted. Drafts per configuration: the argmax;
    the second most likely token; the argmax but a filtered-out last draft (always rejected,
    residual = p); then the argmax again. 20000 rows per configuration, one call."""
    n, T, rng = 20000, K + 1, np.random.default_rng(K)
    C = len(CONFIGS)
    table = _logits(rng, (C, T))                                 # [C, T, V]
    probs, ambiguous = gof.target_probs(table.reshape(C * T, V),
                                        *(np.repeat(x, T) for x in zip(*CONFIGS)))
    assert not ambiguous.any()
    probs = probs.reshape(C, T, V)
    order = np.argsort(-probs[:, :K], axis=-1, kind="stable")    # [C, K, V]
    drafts = order[..., 0].copy()
    drafts[1] = order[1, :, 1]
    drafts[2, K - 1] = order[2, K - 1, V - 1]                    # probability 0 (top-k = 3)
    assert probs[2, K - 1, drafts[2, K - 1]] == 0
    cfg = np.repeat(np.arange(C), n)
    temp, top_k, top_p = _params(CONFIGS, n)
    rows = len(cfg)
    n_acc, new = jax.jit(sampling.verify_drafts)(
        jnp.asarray(table[cfg]), jnp.asarray(drafts[cfg], jnp.int32), jnp.asarray(temp),
        jnp.asarray(top_k), jnp.asarray(top_p), jnp.arange(rows, dtype=jnp.int32),
        jnp.full(rows, 11, jnp.int32))
    n_acc, new = np.asarray(n_acc), np.asarray(new)
    assert n_acc.min() >= 1 and n_acc.max() <= T
    for c in range(C):
        mine = cfg == c
        for j in range(T):
            reached = mine & (n_acc >= j + 1)                    # drafts 1..j accepted
            tok = np.where(n_acc[reached] > j + 1, drafts[c, min(j, K - 1)], new[reached])
            what = f"verify K={K}, {CONFIGS[c]}, position {j}" + (" (bonus)" if j == K else "")
            gof.assert_never_filtered(np.broadcast_to(probs[c, j], (len(tok), V)), tok, what)
            gof.assert_fits(np.bincount(tok, minlength=V), len(tok) * probs[c, j], what)
        if c in (0, 3, 4):                                       # argmax drafts, no 0
            assert np.sum(mine & (n_acc == T)) >= 100, (K, c)


def test_draws_depend_only_on_seed_and_position():
    """A row's draws are a function of its (seed, position) and logits: the same rows in
    another order and company (repeats included) give the same tokens; other seeds or
    positions give other tokens."""
    b, K, rng = 64, 3, np.random.default_rng(7)
    logits = jnp.asarray(_logits(rng, (b, K + 1)))
    drafts = jnp.asarray(np.argmax(logits[:, :K], -1), jnp.int32)
    params = [jnp.asarray(x[:b]) for x in _params(CONFIGS, -(-b // len(CONFIGS)))]
    seeds, pos = jnp.arange(b, dtype=jnp.int32) * 3, jnp.arange(b, dtype=jnp.int32) % 5

    @jax.jit
    def draws(rows, seeds, pos):
        args = [x[rows] for x in params]
        n_acc, new = sampling.verify_drafts(logits[rows], drafts[rows], *args, seeds[rows],
                                            pos[rows])
        tok = sampling.sample(logits[rows, 0], *args, sampling.row_keys(seeds[rows], pos[rows]))
        return jnp.stack([n_acc, new, tok], 1)

    ident = np.arange(b)
    ref = np.asarray(draws(ident, seeds, pos))
    for rows in (rng.permutation(b), np.r_[ident[5:9], ident[::-1][:b - 4]]):
        np.testing.assert_array_equal(np.asarray(draws(rows, seeds, pos)), ref[rows])
    for other in (draws(ident, seeds + 1, pos), draws(ident, seeds, pos + 1)):
        assert np.mean(np.any(np.asarray(other) != ref, axis=1)) > 0.5
