"""Both families' SSM layers through the Mosaic GPU kernels inside the model, at dims those
kernels take (Mamba-2 head dim P = 64, d_state N = 64; GDN K = V = 64; the HF fixtures' 16-wide
heads keep them on Triton): teacher-forced decode logits over two fold cycles (L = 4) in both
SSM modes, and greedy speculative decoding with rollbacks, equal the XLA path's.

Under tensor parallelism (tp = 2, `shard_map` over the heads) the kernels run per device on its
local heads, groups and slot pool: the teacher-forced logits equal the single-device XLA path's
(compiled on 2 GPUs only: the interpreter cannot run two devices' kernels at once).

On the CPU the Mosaic GPU interpreter runs the kernels; on an H100 / H200 they run compiled, and
`impl="auto"` (which picks them there) is checked too. Random fp32 weights; tolerance 1e-4
absolute on logits of std ~0.6 (measured differences ~3e-6)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import sharding
from models.config import parse_config
from models.runner import Runner
from pallas_kernels.dispatch import on_gpu, on_hopper
from replayjax.bench.synthetic import random_model
from tests.models.hf_checks import speculative_greedy

ATOL = 1e-4
CONFIGS = {
    "nemotron_h": dict(
        model_type="nemotron_h", vocab_size=128, hidden_size=64,
        hybrid_override_pattern="M*M-", num_attention_heads=2, num_key_value_heads=1,
        head_dim=32, mamba_num_heads=2, mamba_head_dim=64, n_groups=1, ssm_state_size=64,
        conv_kernel=4, intermediate_size=128, layer_norm_epsilon=1e-5),
    "qwen3_next": dict(
        model_type="qwen3_next", vocab_size=128, hidden_size=64, num_hidden_layers=4,
        full_attention_interval=4, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
        partial_rotary_factor=0.25, rope_theta=1e4, linear_num_key_heads=1,
        linear_num_value_heads=2, linear_key_head_dim=64, linear_value_head_dim=64,
        linear_conv_kernel_dim=4, intermediate_size=128, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=32, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], rms_norm_eps=1e-6,
        tie_word_embeddings=False),
}
# tp = 2: two Mamba-2 heads in two groups, two GDN key and value heads (one of each a device);
# attention's single KV head is replicated
TP_CHANGES = {"nemotron_h": dict(mamba_num_heads=2, n_groups=2),
              "qwen3_next": dict(linear_num_key_heads=2, linear_num_value_heads=2)}
IMPLS = ["pallas_mosaic_gpu"] + (["auto"] if on_hopper() else [])
pytestmark = pytest.mark.skipif(on_gpu() and not on_hopper(),
                                reason="the Mosaic GPU kernels need an sm90 GPU")


@pytest.fixture(scope="module", params=list(CONFIGS))
def runner(request):
    return Runner(random_model(parse_config(CONFIGS[request.param]), jnp.float32, seed=1))


def _batch():
    rng = np.random.default_rng(0)
    prompts = jnp.asarray(rng.integers(1, 128, (2, 6)), jnp.int32)
    return prompts, jnp.asarray([6, 3], jnp.int32), jnp.asarray([2, 1], jnp.int32)


def _forced_logits(runner, mode, impl):
    """Logits [b, 9, V] of 9 teacher-forced decode steps after the prompts (two folds a row)."""
    prompts, lens, slots = _batch()
    forced = np.random.default_rng(1).integers(1, 128, (2, 9))
    cache = runner.init_cache(4, 32, window=4, ssm_mode=mode)
    _, cache = runner.prefill(cache, prompts, lens, slots)
    out = []
    for t in range(forced.shape[1]):
        logits, cache = runner.decode(cache, jnp.asarray(forced[:, t:t + 1], jnp.int32), slots,
                                      mode=mode, impl=impl)
        out.append(np.asarray(logits[:, 0]))
    return np.stack(out, 1)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("mode", ["replay", "standard"])
def test_decode_logits_equal_the_jnp_path(runner, mode, impl):
    want = _forced_logits(runner, mode, "xla")
    np.testing.assert_allclose(_forced_logits(runner, mode, impl), want, atol=ATOL)


@pytest.mark.parametrize("impl", IMPLS)
def test_speculative_rollbacks_give_the_jnp_path_tokens(runner, impl):
    """ReplaySSM verify (the Mosaic kernel) + commit over corrupted drafts: the greedy tokens."""
    prompts, lens, slots = _batch()
    want, _, _ = runner.greedy(runner.init_cache(4, 48, window=4), prompts, lens, slots, 12,
                               impl="xla")
    toks, accepted = speculative_greedy(runner, runner.init_cache(4, 48, window=4, max_verify=4),
                                        prompts,
                                        lens, slots, np.asarray(want), 4,
                                        np.random.default_rng(2), pad_rows=1, impl=impl)
    np.testing.assert_array_equal(toks, want)
    assert accepted > 0


@pytest.mark.parametrize("variant", list(CONFIGS))
def test_tensor_parallel_decode_through_the_kernels(variant):
    """tp = 2: both SSM modes through the Mosaic kernels under shard_map equal one device's XLA
    path on the same weights (`random_model` draws the same bits on a mesh)."""
    if not on_gpu():     # seen on jax 0.11.2: a device's kernel end asserts on the barriers
        pytest.skip("the Mosaic GPU interpreter keeps one shared-memory model for all devices: "
                    "it asserts on another device's live barriers when devices run at once")
    if len(jax.devices()) < 2:
        pytest.skip("needs 2 devices")
    cfg = parse_config({**CONFIGS[variant], **TP_CHANGES[variant]})
    one = Runner(random_model(cfg, jnp.float32, seed=1))
    two = Runner(random_model(cfg, jnp.float32, seed=1, mesh=sharding.make_mesh(2)))
    for mode in ("replay", "standard"):
        np.testing.assert_allclose(_forced_logits(two, mode, IMPLS[-1]),
                                   _forced_logits(one, mode, "xla"), atol=ATOL)
