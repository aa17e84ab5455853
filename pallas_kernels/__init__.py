"""Pallas GPU kernels for buffered (ReplaySSM) decoding of SSM layers; depends on jax only.

Families: `pallas_kernels.mamba2` (Mamba-2 / SSD heads) and `pallas_kernels.gdn` (Gated
DeltaNet), each with `api` (the public ops: validate, dispatch), `buffers` (the cache type),
`reference` (per-row math), `xla` and `pallas_triton` (implementations; Mamba-2 also
`pallas_mosaic_gpu`: Hopper decode kernels) and `prefill`; `pallas_kernels.attention` (decode
attention over the KV slot pool), `pallas_kernels.conv` (the decode conv and conv-state update
over the slot pool) and `pallas_kernels.moe` (routing, sparse routed experts).
Shared: `ring` (the ring contract: slots, counts, verify windows, conv state, draft slots),
`ring_products` (a replay step's ring and window dot products as one Pallas launch),
`dispatch` (backends by name), `validation`, `xla_pool` (the XLA pool ops over a family's row
math), `chunks` (prefill chunking), `_kernel_utils` (for the Pallas builders; the one module
that imports Triton) and `_mosaic_utils` (the Mosaic GPU launch, layouts and interpreter).
"""
