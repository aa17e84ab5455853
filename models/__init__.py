"""Flax NNX model definitions with explicit decode caches.

`config` (HF config.json -> typed configs), `nemotron_h` (Nemotron-H / Nemotron-3), `qwen`
(Qwen3-Next, Qwen3.5 dense and MoE), `hybrid` (prefill / decode / verify / commit shared by both),
`cache`, `common` (linear, norms, attention KV cache), `weights` (HF safetensors loader),
`runner` (split once, jitted pure steps with a donated cache).
"""
