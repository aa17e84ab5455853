"""Mamba-2 decode and verify: standard step (baseline) and ReplaySSM, Pallas (Triton, Mosaic GPU)
and XLA.

Modules: `api` (the public ops: validate, dispatch), `buffers` (the cache type), `reference`
(the per-row math), `xla`, `pallas_triton` and `pallas_mosaic_gpu` (implementations over the slot
pool), `prefill` (chunked SSD scan). The ring contract is `pallas_kernels.ring`.
"""

from pallas_kernels.mamba2 import reference
from pallas_kernels.mamba2.api import replay_decode, replay_verify, standard_decode, standard_verify
from pallas_kernels.mamba2.buffers import ReplayBuffers, init_replay_buffers
from pallas_kernels.mamba2.pallas_mosaic_gpu import (
                                           MOSAIC_REPLAY_TILING,
                                           MOSAIC_STANDARD_TILING,
                                           MOSAIC_VERIFY_TILING,
                                           MOSAIC_VERIFY_TILINGS,
                                           Mamba2MosaicTiling,
)
from pallas_kernels.mamba2.pallas_triton import (
                                           REPLAY_TILING,
                                           STANDARD_TILING,
                                           STANDARD_VERIFY_TILING,
                                           VERIFY_TILING,
                                           Mamba2ReplayTiling,
                                           Mamba2Tiling,
                                           standard_verify_tiling,
)
from pallas_kernels.ring import MAX_VERIFY_TOKENS, MAX_WINDOW, advance_counts, commit_counts

__all__ = ["ReplayBuffers", "init_replay_buffers", "standard_decode", "replay_decode",
           "advance_counts", "replay_verify", "standard_verify", "commit_counts", "reference",
           "MAX_WINDOW", "MAX_VERIFY_TOKENS", "Mamba2Tiling", "Mamba2ReplayTiling",
           "STANDARD_TILING", "STANDARD_VERIFY_TILING", "standard_verify_tiling",
           "REPLAY_TILING", "VERIFY_TILING",
           "Mamba2MosaicTiling", "MOSAIC_STANDARD_TILING", "MOSAIC_REPLAY_TILING",
           "MOSAIC_VERIFY_TILING", "MOSAIC_VERIFY_TILINGS"]
