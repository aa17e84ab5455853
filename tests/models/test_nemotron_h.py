"""Nemotron-H against Hugging Face transformers 5.24 (tests/fixtures/hf, fp32): prefill logits for a
ragged batch, teacher-forced decode logits in both SSM modes, 40 greedy tokens, replay == standard.

Tolerance: 1e-4 absolute on logits of std ~1 (HF fp32 vs fp64 differ by up to 4e-6 here)."""

import numpy as np
import pytest

from convert import load_hf
from models.runner import Runner
from tests.models.hf_checks import check_greedy, check_pallas_greedy, check_prefill_and_forced

FIXTURES = "tests/fixtures/hf"
VARIANTS = ["nemotron_h", "nemotron_h_latent_moe", "nemotron_h_p80"]


def _load(variant):
    d = f"{FIXTURES}/{variant}"
    _, model = load_hf(d)                 # fp32: the fixtures are float32
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
