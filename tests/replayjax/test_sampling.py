"""Sampling and speculative acceptance rules."""

import jax
import jax.numpy as jnp
import numpy as np

from replayjax import sampling


def test_top_k_and_top_p_filters():
    logits = jnp.log(jnp.asarray([[0.5, 0.2, 0.15, 0.1, 0.05]] * 3))
    probs = sampling.filtered_probs(logits, jnp.ones(3), jnp.asarray([2, 0, 0]),
                                    jnp.asarray([1.0, 0.8, 1.0]))
    np.testing.assert_allclose(probs[0], [0.5 / 0.7, 0.2 / 0.7, 0, 0, 0], atol=1e-6)
    np.testing.assert_allclose(probs[1], np.array([0.5, 0.2, 0.15, 0, 0]) / 0.85, atol=1e-6)
    np.testing.assert_allclose(probs[2], [0.5, 0.2, 0.15, 0.1, 0.05], atol=1e-6)


def test_rejection_sampling_preserves_the_target_distribution():
    """A point-mass drafter proposing token 1 every time: the first emitted token must follow the
    target distribution p, whatever the draft (checked over 40000 independent rows)."""
    n, V = 40000, 5
    p = np.array([0.1, 0.4, 0.2, 0.25, 0.05])
    logits = jnp.broadcast_to(jnp.log(jnp.asarray(p, jnp.float32)), (n, 2, V))
    drafts = jnp.ones((n, 1), jnp.int32)
    ones = jnp.ones(n)
    n_acc, new = sampling.verify_drafts(logits, drafts, ones, jnp.zeros(n, jnp.int32), ones,
                                        jnp.arange(n, dtype=jnp.int32), jnp.zeros(n, jnp.int32))
    first = np.where(np.asarray(n_acc) == 2, 1, np.asarray(new))
    freq = np.bincount(first, minlength=V) / n
    assert np.abs(freq - p).max() < 0.012, freq          # ~5 sigma at n = 40000
    assert abs(np.mean(np.asarray(n_acc) == 2) - p[1]) < 0.012


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
