"""Gated DeltaNet decode kernels: standard step (baseline) and ReplaySSM step, with references."""

from pallas_kernels.gdn import reference
from pallas_kernels.gdn.api import (MAX_WINDOW, GDNBuffers, advance_counts, gates,
                                    init_gdn_buffers, prepare_qk, replay_decode, standard_decode)

__all__ = ["GDNBuffers", "init_gdn_buffers", "prepare_qk", "gates", "standard_decode",
           "replay_decode", "advance_counts", "reference", "MAX_WINDOW"]
