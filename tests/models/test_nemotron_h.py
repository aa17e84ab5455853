"""Nemotron-H against Hugging Face transformers 5.24 (tests/fixtures/hf, fp32): prefill logits for a
ragged batch, teacher-forced decode logits in both SSM modes, 40 greedy tokens, replay == standard.

Tolerance: 1e-4 absolute on logits of std ~1 (HF fp32 vs fp64 differ by up to 4e-6 here)."""

import jax.numpy as jnp
import numpy as np
import pytest

from models.config import load_config
from models.nemotron_h import NemotronH
from models.runner import Runner
from models.weights import WeightsError, load_nemotron_h, read_safetensors

FIXTURES = "tests/fixtures/hf"
VARIANTS = ["nemotron_h", "nemotron_h_latent_moe", "nemotron_h_p80"]
ATOL = 1e-4


def _load(variant):
    d = f"{FIXTURES}/{variant}"
    model = NemotronH(load_config(d))
    load_nemotron_h(model, read_safetensors(d))
    return Runner(model), dict(np.load(f"{d}/reference.npz"))


@pytest.fixture(scope="module", params=VARIANTS)
def loaded(request):
    return _load(request.param)


def _batch(ref, num_slots=6):
    prompts, lens = jnp.asarray(ref["prompts"]), jnp.asarray(ref["prompt_lens"])
    slots = jnp.asarray([4, 1, 3][:len(lens)], jnp.int32)       # not in order, not contiguous
    return prompts, lens, slots


def test_prefill_and_teacher_forced_decode(loaded):
    runner, ref = loaded
    prompts, lens, slots = _batch(ref)
    for mode in ("replay", "standard"):
        cache = runner.init_cache(6, 64, window=4)
        logits, cache = runner.prefill(cache, prompts, lens, slots)
        for i, n in enumerate(np.asarray(lens)):
            np.testing.assert_allclose(logits[i, :n], ref["prefill_logits"][i, :n], atol=ATOL)
        forced = ref["forced_tokens"]
        for t in range(forced.shape[1]):          # 8 steps at L = 4: two folds per row
            logits, cache = runner.decode(cache, jnp.asarray(forced[:, t:t + 1]), slots, mode=mode)
            np.testing.assert_allclose(logits[:, 0], ref["forced_logits"][:, t], atol=ATOL)


def test_greedy_matches_hf_and_replay_equals_standard(loaded):
    runner, ref = loaded
    prompts, lens, slots = _batch(ref)
    n = ref["greedy_tokens"].shape[1]
    out = {}
    for mode in ("replay", "standard"):
        cache = runner.init_cache(6, 64, window=4)          # 40 tokens = 10 fold cycles
        toks, lgs, _ = runner.greedy(cache, prompts, lens, slots, n, mode=mode)
        np.testing.assert_array_equal(toks, ref["greedy_tokens"])
        np.testing.assert_allclose(lgs, ref["greedy_logits"], atol=ATOL)
        out[mode] = toks
    np.testing.assert_array_equal(out["replay"], out["standard"])


def test_pallas_kernels_inside_the_model():
    """The Mamba-2 layers through the Pallas kernels (interpret mode on CPU) give HF's greedy
    tokens too, in both modes."""
    runner, ref = _load("nemotron_h")
    prompts, lens, slots = _batch(ref)
    for mode in ("replay", "standard"):
        cache = runner.init_cache(6, 64, window=4)
        toks, _, _ = runner.greedy(cache, prompts, lens, slots, 12, mode=mode, impl="pallas")
        np.testing.assert_array_equal(toks, ref["greedy_tokens"][:, :12])


def test_checkpoint_mismatches_are_named():
    d = f"{FIXTURES}/nemotron_h"
    tensors = read_safetensors(d)
    model = NemotronH(load_config(d))
    bad = dict(tensors, **{"backbone.layers.0.mixer.A_log": np.zeros(5, np.float32)})
    with pytest.raises(WeightsError, match=r"backbone.layers.0.mixer.A_log: expected shape \(4,\)"):
        load_nemotron_h(model, bad)
    missing = {k: v for k, v in tensors.items() if k != "lm_head.weight"}
    with pytest.raises(WeightsError, match="missing tensor lm_head.weight"):
        load_nemotron_h(model, missing)
    with pytest.raises(WeightsError, match="unused tensors"):
        load_nemotron_h(model, dict(tensors, extra=np.zeros(1, np.float32)))
