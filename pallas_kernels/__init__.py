"""Pallas GPU kernels for buffered (ReplaySSM) decoding of SSM layers; depends on jax only.

Families: `pallas_kernels.mamba2` (Mamba-2 / SSD heads), `pallas_kernels.gdn` (Gated DeltaNet).
"""
