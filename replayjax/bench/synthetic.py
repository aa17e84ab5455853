"""Synthetic models: real published dimensions, random weights (`replayjax bench --synthetic`).

Each preset is a Hugging Face config.json (the fields `models.config.parse_config` reads) with
its source. Weights are random at a realistic scale (`randomize`); the SSM state is fp32 whatever
the weight dtype. `build` refuses, in one line, a model that does not fit in free memory.
"""

from __future__ import annotations

import functools
import math
import zlib

from replayjax import memory
from replayjax.commandline import UserError

SYNTHETIC = {
    # NVIDIA Nemotron-H-8B-Base-8K: Megatron-Bridge recipe nemotronh.py (8b) and the hub's
    # config.json (52 layers: 24 Mamba-2, 4 attention, 24 MLP).
    "nemotron-h-8b": dict(
        model_type="nemotron_h", vocab_size=131072, hidden_size=4096,
        hybrid_override_pattern="M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, mamba_num_heads=128,
        mamba_head_dim=64, n_groups=8, ssm_state_size=128, conv_kernel=4,
        intermediate_size=21504, layer_norm_epsilon=1e-5),
    # nvidia/NVIDIA-Nemotron-Nano-9B-v2 (Megatron-Bridge recipe nemotron_nano_v2.py; 56 layers:
    # 27 Mamba-2 with head dim P = 80, 4 attention, 25 MLP): the Mamba-2 kernels' ragged-tile
    # shape (`bench kernels --shapes nemotron-nano-9b-v2`).
    "nemotron-nano-9b-v2": dict(
        model_type="nemotron_h", vocab_size=131072, hidden_size=4480,
        hybrid_override_pattern="M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-",
        num_attention_heads=40, num_key_value_heads=8, head_dim=128, mamba_num_heads=128,
        mamba_head_dim=80, n_groups=8, ssm_state_size=128, conv_kernel=4,
        intermediate_size=15680, layer_norm_epsilon=1e-5),
    # Qwen3.5-9B (dense): transformers 5.24 Qwen3_5TextConfig defaults, documented as the 9B's,
    # matching a published copy of its config.json.
    "qwen3.5-9b": dict(
        model_type="qwen3_5_text", vocab_size=248320, hidden_size=4096, num_hidden_layers=32,
        full_attention_interval=4, num_attention_heads=16, num_key_value_heads=4, head_dim=256,
        partial_rotary_factor=0.25, rope_theta=1e7, linear_num_key_heads=16,
        linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_conv_kernel_dim=4, intermediate_size=12288, rms_norm_eps=1e-6,
        mtp_num_hidden_layers=1),
    # nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 config.json (public copies of the hub file;
    # Megatron-Bridge recipe nemotron_3_nano.py): 52 layers = 23 Mamba-2,
    # 23 MoE (128 experts, top-6, sigmoid routing scaled 2.5, one shared expert), 6 attention.
    "nemotron-3-nano-30b-a3b": dict(
        model_type="nemotron_h", vocab_size=131072, hidden_size=2688,
        hybrid_override_pattern="MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
        num_attention_heads=32, num_key_value_heads=2, head_dim=128, mamba_num_heads=64,
        mamba_head_dim=64, n_groups=8, ssm_state_size=128, conv_kernel=4,
        n_routed_experts=128, num_experts_per_tok=6, moe_intermediate_size=1856,
        n_shared_experts=1, moe_shared_expert_intermediate_size=3712, routed_scaling_factor=2.5,
        norm_topk_prob=True, n_group=1, topk_group=1, intermediate_size=1856,
        layer_norm_epsilon=1e-5),
    # Qwen/Qwen3.5-35B-A3B config.json, text_config (hub snapshot ec2d4ece):
    # 40 layers (3 GDN : 1 gated attention), 256 experts, top-8, expert and shared width 512.
    "qwen3.5-35b-a3b": dict(
        model_type="qwen3_5_moe_text", vocab_size=248320, hidden_size=2048, num_hidden_layers=40,
        full_attention_interval=4, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
        rope_parameters=dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25,
                             mrope_section=[11, 11, 10], mrope_interleaved=True),
        linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_conv_kernel_dim=4, num_experts=256,
        num_experts_per_tok=8, moe_intermediate_size=512, shared_expert_intermediate_size=512,
        rms_norm_eps=1e-6, mtp_num_hidden_layers=1, tie_word_embeddings=False),
    # Qwen/Qwen3-Next-80B-A3B-Instruct config.json (public copies of the hub file): 48 layers,
    # every one MoE (512 experts, top-10, expert and shared width 512);
    # its `intermediate_size` 5120 is unused. The checkpoint ships an MTP layer (mtp.*).
    "qwen3-next-80b-a3b": dict(
        model_type="qwen3_next", vocab_size=151936, hidden_size=2048, num_hidden_layers=48,
        full_attention_interval=4, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
        partial_rotary_factor=0.25, rope_theta=1e7, linear_num_key_heads=16,
        linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_conv_kernel_dim=4, intermediate_size=5120, num_experts=512, num_experts_per_tok=10,
        moe_intermediate_size=512, shared_expert_intermediate_size=512, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], rms_norm_eps=1e-6, tie_word_embeddings=False),
}
# Config fields added only when a variant drafts with MTP, for models whose release has no MTP
# head: Nemotron-H 8B and Nemotron-Nano-9B-v2 get Nemotron 3's "*E" shape with their dense MLP
# ("*-"), as they have no experts; Nemotron-3-Nano is trained with an "*E" head that its release
# does not ship.
SYNTHETIC_MTP = {
    "nemotron-h-8b": dict(num_nextn_predict_layers=1, mtp_hybrid_override_pattern="*-"),
    "nemotron-nano-9b-v2": dict(num_nextn_predict_layers=1, mtp_hybrid_override_pattern="*-"),
    "nemotron-3-nano-30b-a3b": dict(num_nextn_predict_layers=1, mtp_hybrid_override_pattern="*E"),
}


def synthetic_config(name: str, mtp: bool = False):
    """The parsed config of preset `name` (with its MTP fields when `mtp`)."""
    from models.config import parse_config
    return parse_config({**SYNTHETIC[name], **(SYNTHETIC_MTP.get(name, {}) if mtp else {})})


def param_bytes(cfg, dtype, mtp: bool = False) -> tuple[int, int]:
    """(bytes of all weights, elements of the largest one) of a model built from `cfg` with
    weights in `dtype`, without allocating it."""
    from flax import nnx

    from models.registry import model_class
    abstract = nnx.eval_shape(lambda: model_class(cfg)(cfg, dtype=dtype, mtp=mtp))
    shapes = [(math.prod(v.get_value().shape), v.get_value().dtype.itemsize)
              for _, v in nnx.iter_graph(abstract) if isinstance(v, nnx.Param)]
    return sum(n * size for n, size in shapes), max(n for n, _ in shapes)


def add_model_source(ap):
    """--model DIR | --synthetic NAME (one of them), and --dtype for the synthetic weights."""
    from replayjax.commandline import nonempty
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", metavar="DIR", type=nonempty,
                     help="checkpoint directory (HF or converted)")
    src.add_argument("--synthetic", choices=sorted(SYNTHETIC), metavar="NAME",
                     help=f"real dimensions, random weights: {', '.join(sorted(SYNTHETIC))}")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"],
                    help="--synthetic models' weights (default: bfloat16)")


def check_fits(name: str, cfg, dtype, mtp: bool = False, tp: int = 1):
    """UserError (one line) unless 1/tp of the weights of preset `name` -- plus the largest one
    in fp32, which `randomize` draws before casting -- fit in free memory (of one device)."""
    import jax.numpy as jnp
    total, largest = param_bytes(cfg, dtype, mtp)
    if why := memory.shortfall(total // tp + 4 * largest):
        split = f" split over {tp} devices" if tp > 1 else ""
        raise UserError(f"{name} in {jnp.dtype(dtype).name}{split} {why}")


def _kind(path, shape) -> str | None:
    """How `randomize` draws the param at `path`, or None when it keeps its constructor value."""
    name = str(path[-1])
    if name in ("A_log", "dt_bias"):
        return name
    if name in ("embeddings", "embed_tokens"):
        return "embedding"
    if name in ("kernel", "up", "down", "gate", "gate_w", "conv_weight") and len(shape) > 1:
        return "matrix"
    return None


def _draw(kind, fan_in, shape, dtype, key, salt):
    import jax
    import jax.numpy as jnp
    k = jax.random.fold_in(key, salt)
    if kind == "A_log":
        return jnp.log(jax.random.uniform(k, shape, jnp.float32, 1.0, 16.0))
    if kind == "dt_bias":
        dt = jax.random.uniform(k, shape, jnp.float32, 1e-3, 0.1)
        return dt + jnp.log(-jnp.expm1(-dt))
    if kind == "embedding":
        return jax.random.normal(k, shape, jnp.float32).astype(dtype)
    return (jax.random.normal(k, shape, jnp.float32) * fan_in ** -0.5).astype(dtype)


@functools.cache
def _jitted_draw():
    import jax
    return jax.jit(_draw, static_argnums=(0, 1, 2, 3))


def random_param(path, shape, dtype, key):
    """The value `randomize` gives the param at `path` (a tuple of keys; `_kind` must not be
    None), from the seed's `key` with the path folded in. Jitted, one program per kind and
    shape, so a param's values are the same bits however the model is placed afterwards."""
    name = str(path[-1])
    fan_in = shape[-1] if name in ("gate", "conv_weight") else shape[-2] if len(shape) > 1 else 1
    salt = zlib.crc32("/".join(map(str, path)).encode()) & 0x7FFFFFFF
    return _jitted_draw()(_kind(path, shape), fan_in, tuple(shape), dtype, key, salt)


def randomize(model, seed: int = 0):
    """Random weights of realistic scale in place (never benchmark zeros): matrices and expert
    stacks N(0, 1/fan_in), fan_in being the contracted axis (the last for routers [E, D] and
    depthwise conv weights [C, K], else the second to last); embeddings N(0, 1); A_log ~ log
    U(1, 16); dt_bias = softplus^-1 of U(1e-3, 0.1); norms, D and biases keep their constructor
    values. Each param's key comes from its path, so adding an MTP head leaves the other weights
    unchanged."""
    import jax
    from flax import nnx

    key = jax.random.key(seed)
    for path, var in nnx.iter_graph(model):
        if isinstance(var, nnx.Param) and _kind(path, var[...].shape):
            x = var[...]
            var[...] = random_param(path, x.shape, x.dtype, key)
    return model


def random_model(cfg, dtype, seed: int = 0, mtp: bool = False, mesh=None,
                 experts: str = "width"):
    """The model of `cfg` with `randomize`'s weights in `dtype`. On a tensor-parallel mesh
    (`models.sharding`) the params are made in place: the constructor's values of the params
    that keep them, in their shardings, then one at a time each random one drawn (the same bits
    as on one device), laid out device-major and placed, so a device holds its share of the
    model plus at most one whole param."""
    import jax
    from flax import nnx

    from models import sharding
    from models.registry import model_class
    make = lambda: model_class(cfg)(cfg, dtype=dtype, mtp=mtp)     # noqa: E731
    if sharding.mesh_tp(mesh) == 1:
        return randomize(make(), seed)
    rules = sharding.TPRules(cfg, mesh, experts)
    graphdef, state = nnx.split(nnx.eval_shape(make))
    flat = lambda tree: {sharding.param_path(kp): a for kp, a in     # noqa: E731
                         jax.tree_util.tree_flatten_with_path(tree)[0]}
    shapes = flat(nnx.to_pure_dict(state))
    kept = [p for p, a in shapes.items() if not _kind(p, a.shape)]
    values = dict(zip(kept, jax.jit(   # the random params' constructor values are never made
        lambda: [flat(nnx.to_pure_dict(nnx.state(make(), nnx.Param)))[p] for p in kept],
        out_shardings=[rules.sharding(p, shapes[p].shape) for p in kept])()))
    key = jax.random.key(seed)
    for p, a in shapes.items():
        if p not in values:
            values[p] = rules.placer(p, a.shape)(
                random_param(p, a.shape, a.dtype, key))
    nnx.replace_by_pure_dict(state, jax.tree_util.tree_map_with_path(
        lambda kp, _: values[sharding.param_path(kp)], nnx.to_pure_dict(state)))
    return sharding.set_layout(nnx.merge(graphdef, state), rules.tp)


def build(name: str, dtype, seed: int = 0, mtp: bool = False, mesh=None,
          experts: str = "width"):
    """Preset `name` with random weights in `dtype` (and an MTP head when `mtp`), after checking
    that it fits; on `mesh` (tensor parallel) each device holds its share (`random_model`;
    experts: how the routed experts split, `models.sharding.TPRules`)."""
    from models import sharding
    cfg = synthetic_config(name, mtp)
    tp = sharding.mesh_tp(mesh)
    try:
        sharding.check_tp(cfg, tp, experts)
    except ValueError as e:
        raise UserError(f"--synthetic {name}: {e}") from None
    check_fits(name, cfg, dtype, mtp, tp)
    return random_model(cfg, dtype, seed, mtp, mesh, experts)
