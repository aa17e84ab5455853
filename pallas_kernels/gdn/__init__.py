"""Gated DeltaNet decode kernels: standard step (baseline) and ReplaySSM step, with references."""

from pallas_kernels.gdn import reference
from pallas_kernels.gdn.api import (MAX_VERIFY_TOKENS, MAX_WINDOW, GDNBuffers, advance_counts,
                                    commit_counts, gates, init_gdn_buffers, prepare_qk,
                                    replay_decode, replay_verify, standard_decode,
                                    standard_verify)

__all__ = ["GDNBuffers", "init_gdn_buffers", "prepare_qk", "gates", "standard_decode",
           "replay_decode", "advance_counts", "replay_verify", "standard_verify",
           "commit_counts", "reference", "MAX_WINDOW", "MAX_VERIFY_TOKENS"]
