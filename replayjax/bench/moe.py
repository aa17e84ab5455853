"""MoE layer benchmark: one MoE layer of three MoE hybrids, sparse vs dense, on one GPU.

A layer is what the model runs: router (fp32), routed experts, shared expert (Qwen: times
sigmoid(shared_expert_gate(x))), bf16 weights and activations, one token per row (decode). The
routed experts run as
  * "sparse": `pallas_kernels.moe.expert_ffn(impl="pallas", path="grouped")` (sort by expert,
    grouped GEMMs),
  * "sparse-shared": the shared expert in the routed experts' launch and the routing in one
    kernel, as the models run them on a GPU at <= `models.moe.SHARED_IN_LAUNCH_MAX_TOKENS` /
    `pallas_kernels.moe.router.MAX_TOKENS` tokens (`models.moe.routed_experts` with
    shared=, impl and path "auto"; the modules' `route` with impl "pallas"), forced at every
    batch; once per --router-tilings config (fields of `pallas_kernels.moe.RouterTiling` over
    its default, e.g. {"logits": "kernel"}: the logits in the same launch), named with the config,
  * "sparse-small": "sparse-shared" with the experts on the pair path,
    `pallas_kernels.moe.expert_ffn(impl="pallas", path="pairs", shared=...)` (one kernel over
    (token-expert pair, F chunk): both GEMMs, no plan, no sort), at batch <= SMALL_MAX_BATCH
    (the models take it at <= `pallas_kernels.moe.PAIR_PATH_MAX_PAIRS` pairs); once per
    --small-tilings config (fields of `pallas_kernels.moe.PairTiling` over its default), named
    with the config,
  * "tokamax": sort by expert + `tokamax.ragged_dot` (default implementation: Mosaic GPU on
    Hopper; relu^2 fused, SwiGLU's gate and up as one GEMM, the gate applied by XLA), when
    tokamax can be imported,
  * "dense": `pallas_kernels.moe.reference.expert_ffn`, every token through every expert (what
    the models ran before); skipped with a note when it does not fit.
The other variants route in XLA (the router's GEMM, softmax, top-k and the weights' fusions),
as the models do above those bounds.
Method:
  * device time of every kernel of the layer from CUPTI (`profiler.measure`), median over
    iterations of one jitted call that runs `copies` independent layers (own weights, own
    random tokens) one after the other, divided by `copies`, so the experts a call reads are not
    still in the 60 MB L2 from the call before; each copy starts after the one before it ends
    (`chained`), so XLA cannot fuse the copies' small ops into shared launches;
  * the breakdown (--breakdown prints it, --json always holds it): per kernel name (XLA's
    numeric suffixes dropped, so the copies' fusions group), launches and us per layer call
    (median over iterations) and the share of the layer's us;
  * random weights; the router's logits are i.i.d. N(0, 1) per expert, so routing is about
    uniform (the most distinct experts per batch: an upper bound on a trained router's bytes);
  * bytes: the weights the batch needs, i.e. the distinct experts it hits (up, down and for
    SwiGLU gate) + the shared expert (+ gate) + the router (fp32), counted from the actual
    routing; GB/s against the copy bandwidth measured in the same process;
  * FLOPs: the useful ones, 2 n (k expert FFNs + shared expert + router) for n rows; TFLOP/s
    against the bf16 dense peak (--peak-tflops, default from the device name).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import sys

import numpy as np

from replayjax import commandline as cli
from replayjax.bench.timing import add_peak_argument, peak_tflops

PROG = "replayjax bench moe"
BATCHES = (1, 8, 32, 128, 256)
SMALL_MAX_BATCH = 32    # the pair path reads each expert once per pair: no use at large batches


@dataclasses.dataclass(frozen=True)
class MoEShape:
    family: str            # "nemotron_h" (relu^2 experts, sigmoid router) | "qwen" (SwiGLU)
    hidden: int            # D
    experts: int           # E
    top_k: int
    ffn: int               # routed expert width F
    shared_ffn: int        # shared expert width
    scaling: float = 1.0   # Nemotron routed_scaling_factor

    @property
    def swiglu(self) -> bool:
        return self.family == "qwen"


# the models' public config.json files (as in tests/models/test_config.py)
SHAPES = {
    "nemotron-3-nano-30b-a3b": MoEShape("nemotron_h", 2688, 128, 6, 1856, 3712, 2.5),
    "qwen3.5-35b-a3b": MoEShape("qwen", 2048, 256, 8, 512, 512),
    "qwen3-next-80b-a3b": MoEShape("qwen", 2048, 512, 10, 512, 512),
}


def distinct_experts(expert_ids) -> int:
    """Experts a batch hits: expert_ids [n, k] (or any shape)."""
    return int(np.unique(np.asarray(expert_ids)).size)


def expert_bytes(s: MoEShape, itemsize: int = 2) -> int:
    """Weights of one routed expert: up, down (and gate for SwiGLU)."""
    return (3 if s.swiglu else 2) * s.hidden * s.ffn * itemsize


def layer_bytes(s: MoEShape, distinct: int, itemsize: int = 2) -> int:
    """Weight bytes one layer call must read: the distinct experts hit, the shared expert (and
    Qwen's shared gate), the fp32 router (and Nemotron's fp32 correction bias)."""
    mats = 3 if s.swiglu else 2
    shared = mats * s.hidden * s.shared_ffn * itemsize + (s.hidden * itemsize if s.swiglu else 0)
    router = s.experts * s.hidden * 4 + (0 if s.swiglu else s.experts * 4)
    return distinct * expert_bytes(s, itemsize) + shared + router


def layer_flops(s: MoEShape, batch: int) -> int:
    """Useful FLOPs of a layer call over `batch` rows (multiply-add = 2)."""
    mats = 3 if s.swiglu else 2
    per_row = (s.top_k * mats * s.ffn + mats * s.shared_ffn + s.experts
               + (1 if s.swiglu else 0)) * s.hidden
    return 2 * batch * per_row


# ------------------------------------------------------------------------------------- layers

def make_layer(s: MoEShape, key):
    """A MoE module of the family (models.nemotron_h.MoE / models.qwen.MoE), bf16, random."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from models.config import NemotronHConfig, QwenHybridConfig
    if s.swiglu:
        from models.qwen import MoE
        cfg = QwenHybridConfig(
            family="qwen3_5_moe", vocab_size=1, hidden_size=s.hidden, layer_kinds=("attention",),
            num_attention_heads=1, num_key_value_heads=1, head_dim=8, num_experts=s.experts,
            num_experts_per_tok=s.top_k, moe_intermediate_size=s.ffn,
            shared_expert_intermediate_size=s.shared_ffn, linear_num_key_heads=0,
            linear_num_value_heads=0, linear_key_head_dim=0, linear_value_head_dim=0)
    else:
        from models.nemotron_h import MoE
        cfg = NemotronHConfig(
            vocab_size=1, hidden_size=s.hidden, layer_kinds=("moe",), n_routed_experts=s.experts,
            num_experts_per_tok=s.top_k, moe_intermediate_size=s.ffn, n_shared_experts=1,
            moe_shared_expert_intermediate_size=s.shared_ffn, routed_scaling_factor=s.scaling)
    layer = MoE(cfg, jnp.bfloat16)
    graphdef, state = nnx.split(layer)
    leaves, tree = jax.tree_util.tree_flatten_with_path(state)
    # matrices ~ N(0, 1/fan_in), so router logits are ~ N(0, 1) (the router is [E, D]); the
    # correction bias stays zero
    specs = tuple((v.shape, v.dtype.name, v.shape[-1] if getattr(path[0], "key", None) == "gate"
                   else v.shape[-2] if v.ndim >= 2 else 0) for path, v in leaves)
    return nnx.merge(graphdef, jax.tree.unflatten(tree, _randomiser(specs)(key)))


@functools.cache
def _randomiser(specs):
    """A jitted key -> leaves for ((shape, dtype, fan_in), ...); fan_in 0: zeros."""
    import jax
    import jax.numpy as jnp

    @jax.jit
    def leaves(key):
        keys = jax.random.split(key, len(specs))
        return [(jax.random.normal(k, shape, jnp.float32) * fan_in ** -0.5).astype(dtype)
                if fan_in else jnp.zeros(shape, dtype) for k, (shape, dtype, fan_in)
                in zip(keys, specs)]
    return leaves


def expert_weights(layer) -> dict:
    """The routed experts' arrays of a MoE module (what the variants read)."""
    ws = dict(up=layer.up[...], down=layer.down[...])
    if hasattr(layer, "gate_w"):
        ws["gate"] = layer.gate_w[...]
    return ws


def shared_weights(layer) -> dict:
    """`expert_weights` and the shared expert's (`pallas_kernels.moe.SharedWeights`): a
    variant given these runs the shared expert itself (`layer_call`)."""
    return expert_weights(layer) | {"shared": layer.shared.weights()}


def _activation(ws):
    return "swiglu" if "gate" in ws else "relu2"


def sparse_experts(u, ids, w, ws, tiling=None):
    from pallas_kernels import moe
    return moe.expert_ffn(u, ids, w, ws["up"], ws["down"], w_gate=ws.get("gate"),
                          activation=_activation(ws), impl="pallas", path="grouped",
                          tiling=tiling)


def shared_experts(u, ids, w, ws):
    """Routed + shared expert in one launch: ids, w route to the shared chunks too (their last
    columns, `shared_chunks`)."""
    from models import moe
    return moe.routed_experts(u, ids, w, None, ws["up"], ws["down"], w_gate=ws.get("gate"),
                              activation=_activation(ws), num_experts=ws["up"].shape[0],
                              shared=ws["shared"])


def small_experts(u, ids, w, ws, tiling=None):
    """`shared_experts` on the pair path (unsharded, every row valid: what `routed_experts`
    passes on)."""
    from pallas_kernels import moe
    return moe.expert_ffn(u, ids, w, ws["up"], ws["down"], w_gate=ws.get("gate"),
                          activation=_activation(ws), shared=ws.get("shared"), impl="pallas",
                          path="pairs", tiling=tiling)


def _named(variant: str, config: dict) -> str:
    """A variant's name with its tiling override, if any."""
    return variant + (f" {json.dumps(config, separators=(',', ':'))}" if config else "")


def small_variant(config: dict):
    """The "sparse-small" variant name and experts fn of a PairTiling override."""
    from pallas_kernels.moe import pairs
    tiling = dataclasses.replace(pairs.TILING, **config)
    return _named("sparse-small", config), functools.partial(small_experts, tiling=tiling)


def dense_experts(u, ids, w, ws):
    from pallas_kernels import moe
    return moe.reference.expert_ffn(u, ids, w, ws["up"], ws["down"], w_gate=ws.get("gate"),
                                    activation=_activation(ws))


def tokamax_prepare(layer):
    """SwiGLU's gate and up as one [E, din, 2F] GEMM (concatenated once, outside the timing)."""
    import jax.numpy as jnp
    ws = expert_weights(layer)
    if "gate" not in ws:
        return ws
    return dict(down=ws["down"], gate_up=jnp.concatenate([ws["gate"], ws["up"]], axis=2))


def tokamax_experts(u, ids, w, ws):
    """Sort by expert, tokamax.ragged_dot for gate/up and down, weighted scatter-add back."""
    import jax
    import jax.numpy as jnp
    import tokamax
    n, k = ids.shape
    E, F = ws["down"].shape[:2]
    flat = ids.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    tok = order // k
    sizes = jnp.zeros((E,), jnp.int32).at[flat].add(1)
    xs = u.astype(ws["down"].dtype)[tok]
    if "gate_up" in ws:
        gu = tokamax.ragged_dot(xs, ws["gate_up"], sizes, preferred_element_type=jnp.float32)
        hid = (gu[:, :F] * jax.lax.logistic(gu[:, :F]) * gu[:, F:]).astype(xs.dtype)
    else:
        hid = tokamax.ragged_dot(xs, ws["up"], sizes, preferred_element_type=xs.dtype,
                                 activation=lambda v: jnp.square(jnp.maximum(v, 0)))
        # (no jax.nn.relu: its custom_jvp does not lower in tokamax's Mosaic GPU kernel)
    out = tokamax.ragged_dot(hid, ws["down"], sizes, preferred_element_type=jnp.float32)
    out = out * w.reshape(-1)[order][:, None]
    return jnp.zeros(u.shape, jnp.float32).at[tok].add(out).astype(u.dtype)


XLA_ROUTE = {"impl": "xla"}


def layer_call(layer, x, ws, experts, route=XLA_ROUTE):
    """The family's MoE layer on x [n, D] routed by the module's `route(x, **route)`, the
    routed experts computed by experts(u, ids, weights, ws) (the same composition as the
    modules' __call__, unsharded); with the shared expert in ws (`shared_weights`) the routing
    names its chunks too and experts computes it."""
    from models import moe
    C = 0 if "shared" not in ws else moe.shared_chunks(
        x, ws["up"].shape[2], ws["shared"].w_up.shape[1], force=True)
    ids, w = layer.route(x, shared_chunks=C, **route)
    y = experts(x, ids, w, ws)
    return y if C else y + layer.shared_partial(x)


def variants(small_tilings=({},), router_tilings=({},), grouped_tilings=({},)):
    """name -> (prepare(layer) -> ws, experts fn, `layer_call`'s route); sparse once per
    MoETiling override, sparse-shared once per RouterTiling override, sparse-small once per
    PairTiling override; tokamax only when it imports."""
    from pallas_kernels import moe
    out = {_named("sparse", config): (
        expert_weights,
        functools.partial(sparse_experts, tiling=dataclasses.replace(moe.TILING, **config)),
        XLA_ROUTE) for config in grouped_tilings}
    for config in router_tilings:
        route = {"impl": "pallas", "tiling": dataclasses.replace(moe.router.TILING, **config)}
        out[_named("sparse-shared", config)] = (shared_weights, shared_experts, route)
    for config in small_tilings:
        name, fn = small_variant(config)
        out[name] = (shared_weights, fn, {"impl": "pallas"})
    try:
        import tokamax  # noqa: F401
        out["tokamax"] = (tokamax_prepare, tokamax_experts, XLA_ROUTE)
    except ImportError:
        pass
    out["dense"] = (expert_weights, dense_experts, XLA_ROUTE)
    return out


# ------------------------------------------------------------------------------------- timing

def _kernel_times(fn, args, iterations=5):
    """`timing.kernel_times` of one call of fn (CUPTI): per iteration, (kernel, us) launched."""
    from replayjax.bench.timing import kernel_times
    return kernel_times(fn, *args, iterations=iterations)


def kernel_family(name: str) -> str:
    """A kernel's name without XLA's numeric suffixes ("loop_fusion_12" -> "loop_fusion")."""
    return re.sub(r"([._]\d+)+$", "", name)


def breakdown(times, copies: int) -> list[dict]:
    """Per kernel family of `kernel_times` output over `copies` layer calls: launches and us per
    layer call (medians over iterations), share of their sum; most us first."""
    names = dict.fromkeys(kernel_family(k) for it in times for k, _ in it)
    per = {n: (np.median([sum(kernel_family(k) == n for k, _ in it) for it in times]) / copies,
               np.median([sum(us for k, us in it if kernel_family(k) == n) for it in times])
               / copies) for n in names}
    total = sum(us for _, us in per.values()) or 1.0
    return sorted(({"kernel": n, "launches": float(c), "us": float(us), "share": us / total}
                   for n, (c, us) in per.items()), key=lambda r: -r["us"])


def breakdown_lines(row) -> list[str]:
    """Markdown tables of a row's breakdowns, one per timed variant."""
    out = []
    for variant, kernels in row.kernels.items():
        out += [f"\n{row.model}, batch {row.batch}, {variant}: kernels of one layer call",
                "| kernel | launches | us | share |", "|---|---|---|---|"]
        out += [f"| {k['kernel'][:72]} | {k['launches']:g} | {k['us']:.1f} | "
                f"{100 * k['share']:.0f}% |" for k in kernels]
    return out


@dataclasses.dataclass
class Row:
    model: str
    batch: int
    distinct: float          # mean distinct experts hit per layer call
    bytes: float             # mean weight bytes per layer call (see layer_bytes)
    flops: int
    us: dict                 # variant -> us per layer (None: skipped)
    notes: dict              # variant -> why it was skipped
    kernels: dict            # variant -> its `breakdown` (timed variants)

    def line(self, copy_bw, peak):
        cells = []
        for name, us in self.us.items():
            if us is None:
                cells.append(f"{name}: skipped ({self.notes[name]})")
                continue
            gbs = self.bytes / (us * 1e-6) / 1e9
            tf = self.flops / (us * 1e-6) / 1e12
            pct_tf = f" = {100 * tf / peak:.1f}%" if peak else ""
            cells.append(f"{name}: **{us:.1f}** us, {gbs:.0f} GB/s = "
                         f"{100 * gbs * 1e9 / copy_bw:.0f}%, {tf:.1f} TF/s{pct_tf}")
        return (f"| {self.model} | {self.batch} | {self.distinct:.1f} | {self.bytes / 1e6:.1f} | "
                + " | ".join(cells) + " |")


def chained(layers, xs):
    """[layer(x) for layer, x in zip(layers, xs)], each copy's input held back until the copy
    before it is done (`lax.optimization_barrier`), as a model's layers are: independent copies
    let XLA fuse one copy's small ops with another's (the tenth session's breakdown showed 0.25
    launches per layer call of an 11.5 us reduce: one 46 us launch shared by four copies)."""
    import jax
    out = []
    for layer, x in zip(layers, xs):
        if out:
            x, _ = jax.lax.optimization_barrier((x, out[-1]))
        out.append(layer(x))
    return out


def bench(name, s: MoEShape, batch, *, copies=4, iterations=5, seed=0, only=None,
          small_tilings=({},), router_tilings=({},), grouped_tilings=({},)):
    """Times every variant (of `only`'s kinds; None: all) on `copies` independent layers;
    returns a Row."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    keys = jax.random.split(jax.random.key(seed), 2 * copies)
    layers = [make_layer(s, keys[c]) for c in range(copies)]
    xs = [jax.random.normal(keys[copies + c], (batch, s.hidden), jnp.bfloat16)
          for c in range(copies)]
    graphdef = nnx.split(layers[0])[0]
    states = [nnx.split(layer)[1] for layer in layers]
    distinct = [distinct_experts(layer.route(x, **XLA_ROUTE)[0]) for layer, x in zip(layers, xs)]
    us, notes, kernels = {}, {}, {}
    for vname, (prepare, experts, route) in variants(small_tilings, router_tilings,
                                                     grouped_tilings).items():
        if only and vname.split(" ")[0] not in only:
            continue
        if vname.startswith("sparse-small") and batch > SMALL_MAX_BATCH:
            us[vname], notes[vname] = None, f"batch > {SMALL_MAX_BATCH}"
            continue
        wss = [prepare(layer) for layer in layers]

        @jax.jit
        def run(states, wss, xs, experts=experts, route=route):
            return chained([functools.partial(layer_call, nnx.merge(graphdef, st), ws=ws,
                                              experts=experts, route=route)
                            for st, ws in zip(states, wss)], xs)
        try:
            times = _kernel_times(run, (states, wss, xs), iterations)
            us[vname] = float(np.median([sum(t for _, t in it) for it in times])) / copies
            kernels[vname] = breakdown(times, copies)
        except Exception as e:  # noqa: BLE001 (dense may not fit, a peer may not compile: note
            #                       it in the row, time the rest)
            us[vname], notes[vname] = None, f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"
        del wss
    return Row(model=name, batch=batch, distinct=float(np.mean(distinct)),
               bytes=float(np.mean([layer_bytes(s, d) for d in distinct])),
               flops=layer_flops(s, batch), us=us, notes=notes, kernels=kernels)


def build_parser():
    ap = cli.parser(PROG, __doc__, [
        f"{PROG} --models qwen3.5-35b-a3b --batches 1 32 256 --json moe.json",
        f"{PROG} --batches 1 8 --variants sparse-small --small-tilings "
        '\'[{}, {"block_f": 32}, {"block_d": 64}]\'',
        f"{PROG} --batches 1 8 --variants sparse sparse-shared --breakdown --router-tilings "
        '\'[{}, {"logits": "kernel"}, {"logits": "kernel", "num_warps": 8}]\''])
    ap.add_argument("--models", nargs="+", choices=sorted(SHAPES), default=list(SHAPES),
                    metavar="MODEL", help=f"MoE layer shapes: {', '.join(SHAPES)}")
    ap.add_argument("--batches", nargs="+", type=cli.at_least(1), default=list(BATCHES),
                    metavar="N", help="rows (tokens) per layer call")
    ap.add_argument("--variants", nargs="+",
                    choices=["sparse", "sparse-shared", "sparse-small", "tokamax", "dense"],
                    help="expert implementations (default: all that import)")
    ap.add_argument("--grouped-tilings", type=cli.tilings, default=[{}], metavar="CONFIGS",
                    help='sparse once per MoETiling override (the grouped GEMMs), a JSON list: '
                         'e.g. \'[{}, {"up_block_n": 32, "down_block_n": 64}]\'')
    ap.add_argument("--small-tilings", type=cli.tilings, default=[{}], metavar="CONFIGS",
                    help='sparse-small once per PairTiling override, a JSON list: e.g. '
                         '\'[{}, {"block_f": 32}, {"min_programs": 128, "num_warps": 8}]\'')
    ap.add_argument("--router-tilings", type=cli.tilings, default=[{}], metavar="CONFIGS",
                    help='sparse-shared once per RouterTiling override (its routing kernel), a '
                         'JSON list: e.g. \'[{}, {"logits": "kernel"}, {"logits": "kernel", '
                         '"tile_elems": 8192}]\'')
    ap.add_argument("--copies", type=cli.at_least(1), default=4, metavar="N",
                    help="independent layers per timed call (keeps the experts out of L2)")
    add_peak_argument(ap)
    ap.add_argument("--breakdown", action="store_true",
                    help="after the table, each row's kernels: launches, us, share of the layer")
    ap.add_argument("--json", metavar="FILE", type=cli.nonempty,
                    help="also write the rows as JSON to FILE")
    return ap


def parse_args(argv=None):
    return build_parser().parse_args(argv)


def check_tilings(args):
    """UserError unless every --grouped-tilings / --small-tilings / --router-tilings entry is a
    valid override of its tiling (no GPU needed: the dry run of `scripts/gpu_session.sh` checks
    its sweeps with it)."""
    from pallas_kernels import moe
    from pallas_kernels.moe import pairs, router
    from replayjax.bench.kernels import check_tiling
    for config in args.grouped_tilings:
        check_tiling("--grouped-tilings", config, moe.TILING)
    for config in args.small_tilings:
        check_tiling("--small-tilings", config, pairs.TILING)
    for config in args.router_tilings:
        check_tiling("--router-tilings", config, router.TILING)
        if config.get("logits", router.TILING.logits) not in router.LOGITS:
            raise cli.UserError(f"--router-tilings: logits must be one of {router.LOGITS}, got "
                                f"{config['logits']!r}")


def _run(args):
    import jax
    cli.output_path("--json", args.json)
    if missing := [v for v in args.variants or () if v not in variants()]:
        raise cli.UserError(f"--variants {' '.join(missing)}: the tokamax package is not "
                            f"installed")
    check_tilings(args)
    cli.require_gpu()
    from replayjax.bench.timing import copy_bandwidth
    kind = jax.devices()[0].device_kind
    peak = args.peak_tflops or peak_tflops(kind)
    with cli.Progress(1 + len(args.models) * len(args.batches), cli.interactive(args)) as progress:
        with progress.stage("copy bandwidth"):
            bw = copy_bandwidth()
        names = args.variants or variants(args.small_tilings, args.router_tilings,
                                          args.grouped_tilings)
        print(f"device: {kind}; copy bandwidth {bw / 1e12:.2f} TB/s; bf16 peak "
              f"{peak or '?'} TF/s; variants: {', '.join(names)}", flush=True)
        print("| model | batch | experts hit | MB read | per variant: us per layer, GB/s (% of "
              "copy), TF/s (% of peak) |\n|---|---|---|---|---|", flush=True)
        rows = []
        for model in args.models:
            for batch in args.batches:
                with progress.stage(f"{model} batch {batch}"):
                    r = bench(model, SHAPES[model], batch, copies=args.copies,
                              only=args.variants, small_tilings=args.small_tilings,
                              router_tilings=args.router_tilings,
                              grouped_tilings=args.grouped_tilings)
                rows.append(r)
                print(r.line(bw, peak), flush=True)
    if args.breakdown:
        print("\n".join(line for r in rows for line in breakdown_lines(r)), flush=True)
    if args.json:
        cli.write_json(args.json, [dataclasses.asdict(r) | {"copy_bw": bw, "peak_tflops": peak,
                                                            "device": kind} for r in rows])


def main(argv=None):
    return cli.run(PROG, parse_args(argv), _run)


if __name__ == "__main__":
    sys.exit(main())
