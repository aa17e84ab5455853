"""Mamba-2 decode kernels: standard step (baseline) and ReplaySSM step, with jnp references."""

from pallas_kernels.mamba2.api import (MAX_VERIFY_TOKENS, MAX_WINDOW, ReplayBuffers,
                                       advance_counts, commit_counts, init_replay_buffers,
                                       replay_decode, replay_verify, standard_decode,
                                       standard_verify)
from pallas_kernels.mamba2 import reference

__all__ = ["ReplayBuffers", "init_replay_buffers", "standard_decode", "replay_decode",
           "advance_counts", "replay_verify", "standard_verify", "commit_counts", "reference",
           "MAX_WINDOW", "MAX_VERIFY_TOKENS"]
