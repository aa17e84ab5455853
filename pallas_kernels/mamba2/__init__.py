"""Mamba-2 decode kernels: standard step (baseline) and ReplaySSM step, with jnp references."""

from pallas_kernels.mamba2.api import (MAX_WINDOW, ReplayBuffers, advance_counts,
                                       init_replay_buffers, replay_decode, standard_decode)
from pallas_kernels.mamba2 import reference

__all__ = ["ReplayBuffers", "init_replay_buffers", "standard_decode", "replay_decode",
           "advance_counts", "reference", "MAX_WINDOW"]
