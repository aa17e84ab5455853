"""Flax NNX model definitions with explicit decode caches.

`config` (HF config.json -> typed configs), `nemotron_h` (Nemotron-H / Nemotron-3), `qwen`
(Qwen3-Next, Qwen3.5 dense and MoE), `hybrid` (prefill / decode / verify / commit shared by both),
`cache`, `common` (linear, norms, attention KV cache), `registry` (family -> config class, model
class, declared MTP layers), `runner` (split once, jitted pure steps with a donated cache),
`sharding` (tensor parallelism: the tp mesh, partition rules, cache shardings) and `parallel`
(what model code needs on 1/tp of the heads: the axis, its all-reduce, fused layouts).
Weights are loaded by `convert` (`convert.load_hf` for HF directories, `convert.load`).
"""
