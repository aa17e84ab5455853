"""Nemotron-H against Hugging Face transformers 5.24 (tests/fixtures/hf, fp32): prefill logits for a
ragged batch, teacher-forced decode logits in both SSM modes, 40 greedy tokens, replay == standard.

Tolerance: 1e-4 absolute on logits of std ~1 (HF fp32 vs fp64 differ by up to 4e-6 here)."""

import numpy as np
import pytest

from models.config import load_config
from models.nemotron_h import NemotronH
from models.runner import Runner
from models.weights import WeightsError, load_nemotron_h, read_safetensors
from tests.models.hf_checks import (check_greedy, check_pallas_greedy,
                                   check_prefill_and_forced)

FIXTURES = "tests/fixtures/hf"
VARIANTS = ["nemotron_h", "nemotron_h_latent_moe", "nemotron_h_p80"]


def _load(variant):
    d = f"{FIXTURES}/{variant}"
    model = NemotronH(load_config(d))
    load_nemotron_h(model, read_safetensors(d))
    return Runner(model), dict(np.load(f"{d}/reference.npz"))


@pytest.fixture(scope="module", params=VARIANTS)
def loaded(request):
    return _load(request.param)


def test_prefill_and_teacher_forced_decode(loaded):
    check_prefill_and_forced(*loaded)


def test_greedy_matches_hf_and_replay_equals_standard(loaded):
    check_greedy(*loaded)


def test_pallas_kernels_inside_the_model():
    """The Mamba-2 layers through the Pallas kernels (interpret mode on CPU) give HF's greedy
    tokens too, in both modes."""
    check_pallas_greedy(*_load("nemotron_h"))


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
