"""Gated DeltaNet decode and verify: standard step (baseline) and ReplaySSM, Pallas (Triton,
Mosaic GPU) and XLA.

Modules: `api` (the public ops: validate, dispatch), `buffers` (the cache type), `reference`
(the per-row math, `prepare_qk`, `gates`), `xla`, `pallas_triton` and `pallas_mosaic_gpu`
(implementations over the slot pool), `prefill` (chunked WY/UT scan). The ring contract is
`pallas_kernels.ring`.
"""

from pallas_kernels.gdn import reference
from pallas_kernels.gdn.api import replay_decode, replay_verify, standard_decode, standard_verify
from pallas_kernels.gdn.buffers import GDNBuffers, init_gdn_buffers
from pallas_kernels.gdn.pallas_mosaic_gpu import (
                                              MOSAIC_REPLAY_TILING,
                                              MOSAIC_STANDARD_TILING,
                                              MOSAIC_VERIFY_TILING,
                                              MOSAIC_VERIFY_TILINGS,
                                              GDNMosaicTiling,
)
from pallas_kernels.gdn.pallas_triton import (
                                              REPLAY_TILING,
                                              STANDARD_TILING,
                                              STANDARD_VERIFY_TILING,
                                              VERIFY_TILING,
                                              GDNReplayTiling,
                                              GDNTiling,
                                              GDNVerifyTiling,
                                              standard_verify_tiling,
)
from pallas_kernels.gdn.reference import gates, prepare_qk
from pallas_kernels.ring import MAX_VERIFY_TOKENS, MAX_WINDOW, advance_counts, commit_counts

__all__ = ["GDNBuffers", "init_gdn_buffers", "prepare_qk", "gates", "standard_decode",
           "replay_decode", "advance_counts", "replay_verify", "standard_verify",
           "commit_counts", "reference", "MAX_WINDOW", "MAX_VERIFY_TOKENS", "GDNTiling",
           "GDNReplayTiling", "GDNVerifyTiling", "STANDARD_TILING", "STANDARD_VERIFY_TILING",
           "standard_verify_tiling",
           "REPLAY_TILING", "VERIFY_TILING", "GDNMosaicTiling", "MOSAIC_STANDARD_TILING",
           "MOSAIC_REPLAY_TILING", "MOSAIC_VERIFY_TILING", "MOSAIC_VERIFY_TILINGS"]
