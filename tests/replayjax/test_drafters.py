"""Drafters through the `Drafter` interface: the registry, each registered drafter serving the
engine (state shape, greedy tokens equal the plain engine's and HF's), and a drafter defined here
and registered by name (the engine knows drafters only through the interface). The model is the
Nemotron-H fixture with a random MTP head (tests/models/test_mtp.py); it drafts for itself as the
draft model."""

import jax.numpy as jnp
import numpy as np
import pytest

from models.cache import ModelCache
from replayjax import drafters
from replayjax.drafters import DRAFTERS, Drafter, make_drafter, ngram_drafts
from replayjax.engine import Engine, Request
from tests.models import test_mtp
from tests.models.hf_checks import load
from tests.replayjax.spec_counts import every_draft_accepted

K = 2


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    model = test_mtp._setup(tmp_path_factory.mktemp("mtp"), "nemotron_h", "nemotron_h")[1]
    ref = load("nemotron_h")[1]
    prompts = [list(p[:n]) for p, n in zip(ref["prompts"], ref["prompt_lens"])]
    return model, prompts, ref["greedy_tokens"]


def _requests(prompts):
    return [Request(prompt=prompts[i], max_new_tokens=n) for i, n in [(0, 12), (1, 5), (2, 9)]]


def test_registry_and_default_names(fixture):
    model = fixture[0]
    assert list(DRAFTERS) == ["none", "ngram", "mtp", "draft"]
    assert all(issubclass(cls, Drafter) and cls.name == name for name, cls in DRAFTERS.items())
    assert type(make_drafter(None, model, num_draft=0)) is drafters.NoDrafter
    assert type(make_drafter(None, model, num_draft=K)) is drafters.NgramDrafter
    d = make_drafter("draft", model, num_draft=K, draft_model=model)
    assert d.models == (model,) and d.num_draft == K and d.speculative


def test_ngram_drafter():
    assert ngram_drafts([5, 6, 7, 9, 5, 6], 3) == [7, 9, 5]
    assert ngram_drafts([1, 2, 3], 2) == [3, 3]
    assert ngram_drafts([4], 2) == [4, 4]
    d = drafters.NgramDrafter(None, num_draft=3)
    host = np.asarray(d.host_drafts(4, {2: ((5, 6, 7, 9), [5, 6])}))
    assert host.shape == (4, 3) and host[2].tolist() == [7, 9, 5] and not host[[0, 1, 3]].any()


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_each_drafter_serves_greedy(fixture, name):
    model, prompts, want = fixture
    kw = dict(drafter=name, num_draft=0 if name == "none" else K)
    if name == "draft":
        kw["draft_model"] = model
    eng = Engine(model, num_slots=2, max_len=64, window=4, **kw)
    assert isinstance(eng.drafter, DRAFTERS[name])
    state = eng.state.drafter
    if name == "mtp":
        assert state.shape == (3, K) and state.dtype == jnp.int32      # next drafts per slot
    elif name == "draft":
        assert isinstance(state, ModelCache) and state.num_slots == 3
    else:
        assert state is None
    out = eng.generate(_requests(prompts))
    assert [c.tokens for c in out] == [list(want[i, :n]) for i, n in [(0, 12), (1, 5), (2, 9)]]
    kinds = {kind for kind, *_ in eng.visits}
    assert kinds == ({"prefill", "decode"} if name == "none" else {"prefill", "verify"})
    if name == "draft":                 # the model drafting for itself is always right
        assert all(every_draft_accepted(c, K) for c in out)


class RepeatLast(Drafter):
    """A device drafter kept here: proposes the last token K times, and counts its steps per
    slot in its own state (so prefill and commit hooks run with a state to carry)."""

    name = "repeat"

    def init_state(self, num_slots, init_cache):
        return jnp.zeros((num_slots,), jnp.int32)

    def prefill(self, target, own, cache, state, p):
        return cache, state.at[p.slots].set(0)

    def propose(self, target, own, cache, state, last, slots, host):
        return jnp.repeat(last[:, None], self.num_draft, axis=1)

    def commit(self, target, own, cache, state, v):
        return cache, state + v.active


def test_a_registered_drafter_runs_through_the_interface(fixture, monkeypatch):
    model, prompts, want = fixture
    monkeypatch.setitem(DRAFTERS, "repeat", RepeatLast)
    eng = Engine(model, num_slots=2, max_len=64, window=4, drafter="repeat", num_draft=K)
    eng.record_drafts = True
    reqs = _requests(prompts)
    out = eng.generate(reqs)
    assert [c.tokens for c in out] == [list(want[i, :n]) for i, n in [(0, 12), (1, 5), (2, 9)]]
    for r, c in zip(reqs, out):
        seq = list(r.prompt) + c.tokens                # drafts at cache length n: seq[n] K times
        assert c.drafts and all(d == [seq[n]] * K for n, d in c.drafts)
    assert int(np.asarray(eng.state.drafter).sum()) > 0    # its commit hook ran


class HostCounter(Drafter):
    """A drafter of its own on the host: drafts the number of host_drafts calls so far, so a
    step verifying stale host drafts would show."""

    name = "host-counter"
    calls = 0

    def host_drafts(self, num_rows, histories):
        HostCounter.calls += 1
        return jnp.full((num_rows, self.num_draft), HostCounter.calls % 50 + 3, jnp.int32)

    def propose(self, target, own, cache, state, last, slots, host):
        return host


def test_host_drafters_take_one_step_a_visit(fixture, monkeypatch):
    """A drafter that overrides `host_drafts` drafts on the host (`Drafter.on_host`), so its
    visits run one speculative step each, whatever steps_per_visit; the built-in ones: "ngram"
    on the host, "mtp" and "draft" on device."""
    model, prompts, want = fixture
    assert [object.__new__(DRAFTERS[n]).on_host for n in ("ngram", "mtp", "draft")] == [
        True, False, False]
    monkeypatch.setitem(DRAFTERS, "host-counter", HostCounter)
    eng = Engine(model, num_slots=2, max_len=64, window=4, drafter="host-counter",
                 num_draft=K, steps_per_visit=6)
    assert eng.drafter.on_host
    out = eng.generate(_requests(prompts))
    assert [c.tokens for c in out] == [list(want[i, :n]) for i, n in [(0, 12), (1, 5), (2, 9)]]
    verify = [n for kind, n, _ in eng.visits if kind == "verify"]
    assert verify and set(verify) == {1} and HostCounter.calls >= len(verify)
