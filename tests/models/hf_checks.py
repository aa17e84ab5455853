"""The HF fixtures (tests/fixtures/hf: tiny checkpoints made by transformers 5.24 and their
reference.npz) and the checks against them shared by the model and engine tests: tolerance 1e-4
absolute on logits of std ~1."""

import jax.numpy as jnp
import numpy as np

from convert import load_hf
from models.runner import Runner

ATOL = 1e-4
FIXTURES = "tests/fixtures/hf"
NEMOTRON_VARIANTS = ["nemotron_h", "nemotron_h_latent_moe", "nemotron_h_p80"]
QWEN_VARIANTS = ["qwen3_next", "qwen3_5", "qwen3_5_moe"]


def load(variant):
    """(Runner of the fixture's model in fp32, its reference arrays)."""
    d = f"{FIXTURES}/{variant}"
    _, model = load_hf(d)                 # fp32: the fixtures are float32
    return Runner(model), dict(np.load(f"{d}/reference.npz"))


def batch(ref):
    """The fixture's ragged prompts on slots that are not in order and not contiguous."""
    prompts, lens = jnp.asarray(ref["prompts"]), jnp.asarray(ref["prompt_lens"])
    return prompts, lens, jnp.asarray([4, 1, 3][:len(lens)], jnp.int32)


def check_prefill_and_forced(runner, ref):
    """Prefill logits of the ragged batch (all positions, and the generator's last-token-only
    form), then 8 teacher-forced decode steps (two folds per row at L = 4), in both SSM modes."""
    prompts, lens, slots = batch(ref)
    last, _ = runner.model.prefill(runner.init_cache(6, 64, window=4), prompts, lens, slots,
                                   last_only=True)
    want = ref["prefill_logits"][np.arange(len(lens)), np.asarray(lens) - 1]
    np.testing.assert_allclose(last[:, 0], want, atol=ATOL)
    for mode in ("replay", "standard"):
        cache = runner.init_cache(6, 64, window=4)
        logits, cache = runner.prefill(cache, prompts, lens, slots)
        for i, n in enumerate(np.asarray(lens)):
            np.testing.assert_allclose(logits[i, :n], ref["prefill_logits"][i, :n], atol=ATOL)
        forced = ref["forced_tokens"]
        for t in range(forced.shape[1]):
            logits, cache = runner.decode(cache, jnp.asarray(forced[:, t:t + 1]), slots, mode=mode)
            np.testing.assert_allclose(logits[:, 0], ref["forced_logits"][:, t], atol=ATOL)


def check_greedy(runner, ref):
    """40 greedy tokens (10 fold cycles at L = 4) equal HF's in both modes; replay == standard."""
    prompts, lens, slots = batch(ref)
    n = ref["greedy_tokens"].shape[1]
    out = {}
    for mode in ("replay", "standard"):
        cache = runner.init_cache(6, 64, window=4)
        toks, lgs, _ = runner.greedy(cache, prompts, lens, slots, n, mode=mode)
        np.testing.assert_array_equal(toks, ref["greedy_tokens"])
        np.testing.assert_allclose(lgs, ref["greedy_logits"], atol=ATOL)
        out[mode] = toks
    np.testing.assert_array_equal(out["replay"], out["standard"])


def check_pallas_greedy(runner, ref, n=12):
    """The SSM layers through the Pallas kernels (interpret mode on CPU): HF's greedy tokens."""
    prompts, lens, slots = batch(ref)
    for mode in ("replay", "standard"):
        cache = runner.init_cache(6, 64, window=4)
        toks, _, _ = runner.greedy(cache, prompts, lens, slots, n, mode=mode, impl="pallas")
        np.testing.assert_array_equal(toks, ref["greedy_tokens"][:, :n])


def corrupted_drafts(want, out, T, rng):
    """Drafts [b, T - 1] for the next speculative step: each row's true greedy continuation
    (want [b, n] after its len(out[r]) emitted tokens), a third of the tokens replaced at random."""
    drafts = np.zeros((len(out), T - 1), np.int32)
    for r, o in enumerate(out):
        true = list(want[r, len(o):len(o) + T - 1]) + [0] * (T - 1)
        drafts[r] = [t if rng.random() > 0.33 else int(rng.integers(3, 128)) for t in true[:T - 1]]
    return drafts


def greedy_accept(drafts, pred):
    """Greedy verification on the host: drafts [b, T - 1], the model's argmax over the window
    pred [b, T]. Returns n_accepted [b] int32 (1 + the matching draft prefix) and each row's
    emitted tokens (the accepted drafts, then the model's token after them)."""
    b, T = pred.shape
    n_acc = np.ones(b, np.int32)
    emitted = []
    for r in range(b):
        while n_acc[r] < T and drafts[r, n_acc[r] - 1] == pred[r, n_acc[r] - 1]:
            n_acc[r] += 1
        emitted.append([int(t) for t in drafts[r, :n_acc[r] - 1]] + [int(pred[r, n_acc[r] - 1])])
    return n_acc, emitted


def speculative_greedy(runner, cache, prompts, lens, slots, want, T, rng, *, pad_rows=0,
                       mode="replay", impl="auto"):
    """Greedy speculative decoding at the model level until every row has want.shape[1] tokens:
    prefill, then verify windows [last, drafts] (`corrupted_drafts`), `greedy_accept`, commit.
    `pad_rows` extra window rows on the null slot (commit 1) exercise padding. Returns the
    tokens [b, n] and the number of accepted drafts."""
    b, n = want.shape
    vslots = jnp.concatenate([slots, jnp.zeros((pad_rows,), jnp.int32)])
    logits, cache = runner.prefill(cache, prompts, lens, slots)
    last = np.asarray(jnp.argmax(logits[jnp.arange(b), lens - 1], -1))
    out = [[int(t)] for t in last]
    accepted = 0
    while min(len(o) for o in out) < n:
        drafts = corrupted_drafts(want, out, T, rng)
        window = np.concatenate([np.concatenate([last[:, None], drafts], 1),
                                 np.zeros((pad_rows, T))])
        logits, _, cache = runner.verify(cache, jnp.asarray(window, jnp.int32), vslots,
                                         mode=mode, impl=impl)
        pred = np.asarray(jnp.argmax(logits[:b], -1))
        n_acc, emitted = greedy_accept(drafts, pred)
        accepted += int(n_acc.sum()) - b
        for r in range(b):
            out[r] += emitted[r]
        last = pred[np.arange(b), n_acc - 1]
        n_commit = np.concatenate([n_acc, np.ones(pad_rows, np.int32)])
        cache = runner.commit(cache, vslots, jnp.asarray(n_commit), T, mode=mode)
    return np.array([o[:n] for o in out]), accepted
