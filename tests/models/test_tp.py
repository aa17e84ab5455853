"""Tensor parallelism on 4 CPU devices (tests/conftest.py): every HF fixture at tp = 2 and 4, in
both SSM modes, through the engine with speculative decoding (drafts accepted in full, in part
and not at all, so rings, conv states and KV lengths roll back), gives HF's greedy tokens and
logits within 1e-4 -- the oracle the single-device model is held to (tests/models/test_*.py).
The fixtures' head counts divide 4; their KV heads (2 for Nemotron, 1 for Qwen) are sharded at
tp = 2 (Nemotron) and replicated otherwise. Plain decode in both modes, expert parallelism, the
Pallas kernels under shard_map, MTP drafting, the loaders' device-major layout and the rules are
checked alongside.

Cost: each (fixture, tp, mode) compiles two steps (prefill, speculative step); models and meshes
are loaded once per module."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from convert import ConvertError, convert, load, load_hf
from models import sharding
from models.cache import SSMCache
from models.common import KVCache
from models.config import load_config
from models.parallel import split_fused
from models.runner import Runner
from replayjax import drafters
from replayjax.bench.synthetic import random_model
from replayjax.engine import Engine, Request
from tests.models import test_mtp
from tests.models.hf_checks import ATOL, batch, check_greedy

FIXTURES = "tests/fixtures/hf"
VARIANTS = ["nemotron_h", "nemotron_h_latent_moe", "nemotron_h_p80", "qwen3_next", "qwen3_5",
            "qwen3_5_moe"]
NEW = 24            # tokens per request: 6+ speculative steps of T = 4 at L = 4


def _devices(tp):
    """Skips a test that needs more devices than there are (a 2-GPU machine runs tp = 2)."""
    if tp > len(jax.devices()):
        pytest.skip(f"needs {tp} devices")


def _dir(variant):
    return f"{FIXTURES}/{variant}"


@functools.cache
def _ref(variant):
    return dict(np.load(f"{_dir(variant)}/reference.npz"))


@functools.cache
def _model(variant, tp=1, experts="width"):
    """The fixture loaded onto a tp mesh (tp = 1: one device, natural layout), its routed
    experts split by `experts`."""
    return load_hf(_dir(variant), mesh=sharding.make_mesh(tp) if tp > 1 else None,
                   experts=experts)[1]


def _params(model):
    return nnx.state(model, nnx.Param)


class OracleDrafter(drafters.Drafter):
    """Host drafts from the reference greedy continuation with every fourth position (counted
    in the continuation) wrong: speculative steps accept all, some or none of their drafts."""

    name = "oracle"
    continuations = {}          # prompt (tuple) -> reference greedy tokens

    def host_drafts(self, num_slots, histories):
        out = np.zeros((num_slots, self.num_draft), np.int32)
        for s, (prompt, tokens) in histories.items():
            want = self.continuations[tuple(prompt)]
            for j, p in enumerate(range(len(tokens), len(tokens) + self.num_draft)):
                t = int(want[p]) if p < len(want) else 3
                out[s, j] = t if p % 4 != 2 else 3 + (t + 1) % 100
        return jnp.asarray(out)

    def propose(self, target, own, cache, state, last, slots, host):
        return host


# every variant once; both families in both modes at both degrees (the full product repeats
# the same code paths at 4x the CI time)
SPEC_CASES = [("nemotron_h", 2, "replay"), ("nemotron_h", 4, "standard"),
              ("qwen3_next", 4, "replay"), ("qwen3_next", 2, "standard"),
              ("qwen3_5", 2, "replay"), ("qwen3_5_moe", 4, "standard"),
              ("nemotron_h_latent_moe", 4, "replay"), ("nemotron_h_p80", 2, "standard")]
assert {v for v, _, _ in SPEC_CASES} == set(VARIANTS)


def oracle_prompts(variant, tp, monkeypatch):
    """(HF reference, prompts) of a fixture with the "oracle" drafter registered to draft its
    greedy continuations."""
    ref = _ref(variant)
    prompts = [ref["prompts"][i, :n].tolist() for i, n in enumerate(ref["prompt_lens"])]
    monkeypatch.setitem(drafters.DRAFTERS, "oracle", OracleDrafter)
    monkeypatch.setattr(OracleDrafter, "continuations",
                        {tuple(p): w for p, w in zip(prompts, ref["greedy_tokens"])})
    return ref, prompts


@pytest.mark.parametrize("variant,tp,mode", SPEC_CASES)
def test_speculative_greedy_equals_single_device(variant, tp, mode, monkeypatch):
    """tp = 2: the model loaded onto the mesh (convert.load_hf); tp = 4: a single-device model
    laid out and placed by the engine (Engine(mesh=...) -> shard_model)."""
    ref, prompts = oracle_prompts(variant, tp, monkeypatch)
    kw = dict(model=_model(variant, tp)) if tp == 2 else dict(model=_model(variant),
                                                              mesh=sharding.make_mesh(tp))
    engine = Engine(**kw, num_slots=3, max_len=64, window=4, num_draft=3, drafter="oracle",
                    ssm_mode=mode, return_logits=True)
    out = engine.generate([Request(prompt=p, max_new_tokens=NEW) for p in prompts])
    for i, c in enumerate(out):
        assert c.tokens == ref["greedy_tokens"][i, :NEW].tolist(), i
        np.testing.assert_allclose(c.logits, ref["greedy_logits"][i, :NEW], atol=ATOL)
    accepted = [c.accepted_drafts for c in out]
    assert all(0 < a < 3 * c.verify_steps for a, c in zip(accepted, out))   # some rejected
    assert sum(accepted) > NEW                                 # and many accepted
    for lc in engine.cache.layers:       # the state stayed on its devices step after step
        if isinstance(lc, SSMCache):
            assert lc.buffers.checkpoint.sharding.spec == P(None, "tp")
            assert lc.conv.sharding.spec == P(None, None, "tp")
    assert engine.cache.counts.sharding.spec == P()


@pytest.mark.parametrize("variant,tp", [("nemotron_h", 2), ("qwen3_next", 4)])
def test_greedy_decode_both_modes(variant, tp):
    """Plain decode (the decode kernels, not verify): 40 greedy tokens in both modes equal HF's,
    logits within 1e-4; replay == standard."""
    runner = Runner(_model(variant, tp))
    assert sharding.mesh_tp(runner.mesh) == tp
    check_greedy(runner, _ref(variant))


@pytest.mark.parametrize("variant,tp", [("nemotron_h_latent_moe", 4), ("qwen3_5_moe", 2)])
def test_expert_parallel_greedy_decode(variant, tp):
    """Expert parallel (each device tp / E whole experts, its own (token, expert) pairs only):
    greedy tokens in both modes equal HF's, logits within 1e-4, as with the experts split on
    their width."""
    model = _model(variant, tp, "experts")
    up = next(v for p, v in nnx.iter_graph(model) if p[-1] == "up" and isinstance(v, nnx.Param))
    assert up.get_value().sharding.spec == P("tp", None, None)
    check_greedy(Runner(model), _ref(variant))


@pytest.mark.devices(2)
@pytest.mark.parametrize("variant", ["nemotron_h", "qwen3_next"])
def test_pallas_kernels_under_shard_map(variant):
    """The Pallas replay-decode kernels (interpret mode) run per device on local heads."""
    runner = Runner(_model(variant, 2))
    ref = _ref(variant)
    prompts, lens, slots = batch(ref)
    toks, _, _ = runner.greedy(runner.init_cache(6, 32, window=4), prompts, lens, slots, 5,
                               impl="pallas")
    np.testing.assert_array_equal(toks, ref["greedy_tokens"][:, :5])


def test_layout_round_trip():
    """device_major puts each device's slice of every piece together; split_fused reads the
    pieces back in head order from any number of blocks."""
    sizes, tp = (8, 8, 4, 4, 2), 2
    x = np.arange(sum(sizes))
    laid = x[sharding.device_major(sizes, tp)]
    np.testing.assert_array_equal(laid[:13], np.r_[0:4, 8:12, 16:18, 20:22, 24])
    natural = np.split(x, np.cumsum(sizes)[:-1])
    for blocks in (1, 2):                         # a device of tp = 2, or the whole array
        local = laid[:len(x) * blocks // tp]
        pieces = split_fused(jnp.asarray(local), [s // tp for s in sizes], blocks)
        for got, want in zip(pieces, natural):
            np.testing.assert_array_equal(got, want[:len(want) * blocks // tp])


def _rules(cfg, tp):
    return sharding.TPRules(cfg, jax.sharding.AbstractMesh((tp,), ("tp",)))


def test_rules():
    cfg = load_config(_dir("nemotron_h"))
    r2, r4 = _rules(cfg, 2), _rules(cfg, 4)
    k_proj = ("layers", 1, "mixer", "k_proj", "kernel")
    assert r2.spec(k_proj, (32, 32)) == P(None, "tp")     # 2 KV heads: split at tp = 2
    assert r4.spec(k_proj, (32, 32)) == P()               # replicated at tp = 4
    assert r4.spec(("layers", 0, "mixer", "in_proj", "kernel"), (32, 200)) == P(None, "tp")
    assert r4.spec(("layers", 0, "mixer", "out_proj", "kernel"), (64, 32)) == P("tp", None)
    assert r4.spec(("layers", 5, "mixer", "up"), (8, 32, 32)) == P(None, None, "tp")
    assert r4.spec(("lm_head", "kernel"), (32, 128)) == P(None, "tp")   # vocab-parallel
    assert r4.spec(("lm_head", "kernel"), (32, 130)) == P()   # tp does not divide V
    assert r4.fused(("layers", 0, "mixer", "conv_weight"))
    assert not r4.fused(("layers", 0, "mixer", "out_proj", "kernel"))
    qwen = load_config(_dir("qwen3_next"))
    rq = _rules(qwen, 4)
    assert rq.spec(("layers", 0, "mixer", "norm"), (16,)) == P()     # per value head, shared
    assert rq.spec(("layers", 0, "mlp", "gate"), (8, 32)) == P()      # the router
    assert rq.spec(("layers", 0, "mlp", "gate_w"), (8, 32, 32)) == P(None, None, "tp")
    ep = sharding.TPRules(qwen, jax.sharding.AbstractMesh((4,), ("tp",)), experts="experts")
    assert ep.spec(("layers", 0, "mlp", "gate_w"), (8, 32, 32)) == P("tp", None, None)
    assert ep.spec(("layers", 0, "mlp", "down"), (8, 32, 32)) == P("tp", None, None)
    assert ep.spec(("layers", 0, "mlp", "shared", "up_proj", "kernel"), (32, 32)) == \
        P(None, "tp")                                          # the shared expert: its width


def test_counts_the_mesh_cannot_split():
    cfg = load_config(_dir("qwen3_next"))
    with pytest.raises(ValueError, match=r"tp = 3 does not divide the model's num_attention_"
                                         r"heads \(4\)"):
        sharding.check_tp(cfg, 3)
    nemo = load_config(_dir("nemotron_h"))
    with pytest.raises(ValueError, match=r"tp = 4 and the model's num_key_value_heads \(3\) must "
                                         r"divide one another"):
        sharding.check_tp(dataclasses.replace(nemo, num_attention_heads=12,
                                              num_key_value_heads=3), 4)
    moe = load_config(_dir("qwen3_5_moe"))
    sharding.check_tp(dataclasses.replace(moe, num_experts=6), 2, experts="experts")
    with pytest.raises(ValueError, match=r"tp = 4 does not divide the model's num_experts \(6\)"):
        sharding.check_tp(dataclasses.replace(moe, num_experts=6), 4, experts="experts")
    n = len(jax.devices())
    with pytest.raises(ValueError, match=f"tp = {n + 1} exceeds the {n} visible"):
        sharding.make_mesh(n + 1)
    _devices(3)
    with pytest.raises(ConvertError, match=r"nemotron_h_p80: tp = 3 does not divide"):
        load_hf(_dir("nemotron_h_p80"), mesh=sharding.make_mesh(3))


@pytest.mark.devices(2)
def test_converted_checkpoint_loads_onto_the_mesh(tmp_path):
    """convert.load restores each param sharded, then lays the fused ones out on the devices:
    the same arrays and shardings as load_hf's host-side layout."""
    tp = min(4, len(jax.devices()))
    out = tmp_path / "ckpt"
    convert(_dir("qwen3_next"), out)
    _, restored = load(out, mesh=sharding.make_mesh(tp))
    direct = _model("qwen3_next", tp)
    got, want = (jax.tree_util.tree_leaves_with_path(_params(m)) for m in (restored, direct))
    for (path, a), (_, b) in zip(got, want):
        assert a.sharding == b.sharding, path
        np.testing.assert_array_equal(a, b, err_msg=str(path))
    assert restored.layers[0].mixer.tp_layout == tp


@pytest.mark.devices(2)
def test_engine_refuses_a_model_on_another_mesh():
    other = sharding.make_mesh(2, devices=jax.devices()[1::-1])       # the same 2, reversed
    with pytest.raises(ValueError, match="placed on another mesh"):
        Engine(_model("nemotron_h", 2), mesh=other)


def test_kv_cache_specs():
    """Nemotron's 2 KV heads: split at tp = 2, replicated at tp = 4; SSM pools on heads."""
    cache = _model("nemotron_h").init_cache(3, 16, window=4)
    for tp, kv in ((2, P(None, None, "tp")), (4, P())):
        specs = sharding.cache_specs(cache, tp)
        assert [s.k for s in specs.layers if isinstance(s, KVCache)] == [kv]
        assert specs.layers[0].buffers.ring_b == P(None, "tp")


@pytest.mark.devices(2)
def test_mtp_drafter(tmp_path):
    """MTP drafting at tp = 2: the head's attention (its own KV cache, sharded with the target's)
    and MoE layers split like the body; greedy output unchanged."""
    model = test_mtp._setup(tmp_path, "nemotron_h", "nemotron_h")[1]
    ref = _ref("nemotron_h")
    prompts = [ref["prompts"][i, :n].tolist() for i, n in enumerate(ref["prompt_lens"])]
    engine = Engine(model, num_slots=3, max_len=64, window=4, num_draft=3, drafter="mtp",
                    mesh=sharding.make_mesh(2))
    out = engine.generate([Request(prompt=p, max_new_tokens=12) for p in prompts])
    assert [c.tokens for c in out] == ref["greedy_tokens"][:, :12].tolist()
    assert [kv.k.sharding.spec for kv in engine.cache.mtp if kv is not None] == \
        [P(None, None, "tp")]


@pytest.mark.devices(2)
def test_synthetic_weights_are_the_same_on_the_mesh():
    """`replayjax bench --synthetic --tp N` builds its random model in place: the same bits as
    the one-device model, laid out by the rules (what `shard_model` makes of it)."""
    cfg = load_config(_dir("qwen3_next"))
    mesh = sharding.make_mesh(2)
    want = sharding.shard_model(random_model(cfg, jnp.float32, seed=3), mesh)
    got = random_model(cfg, jnp.float32, seed=3, mesh=mesh)
    for (path, a), (_, b) in zip(*(jax.tree_util.tree_leaves_with_path(_params(m))
                                   for m in (got, want))):
        assert a.sharding == b.sharding, path
        np.testing.assert_array_equal(a, b, err_msg=str(path))
