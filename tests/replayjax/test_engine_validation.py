"""Every bad engine setting and every bad request is refused with a one-line error naming the
field and the rule, before anything is queued or compiled (nothing silently changes meaning)."""

import math

import jax.numpy as jnp
import pytest

from replayjax.engine import Engine, Request, RequestError, SamplingParams
from tests.models.hf_checks import load


@pytest.fixture(scope="module")
def model():
    return load("nemotron_h")[0].model        # vocab 128


@pytest.fixture(scope="module")
def engine(model):
    return Engine(model, num_slots=2, max_len=64, window=4, num_draft=2)


def _one_line(excinfo):
    msg = str(excinfo.value)
    assert "\n" not in msg, msg
    return msg


@pytest.mark.parametrize("kw,match", [
    (dict(num_slots=0), "num_slots must be >= 1, got 0"),
    (dict(num_slots=2.5), "num_slots must be an integer, got 2.5"),
    (dict(max_len=0), "max_len must be >= 1, got 0"),
    (dict(steps_per_visit=0), "steps_per_visit must be >= 1, got 0"),
    (dict(prefill_rows=0), "prefill_rows must be >= 1, got 0"),
    (dict(prefill_tokens=0), "prefill_tokens must be >= 1, got 0"),
    (dict(window=6), r"window must be a power of two in \[1, 64\]"),
    (dict(window=128), r"window must be a power of two in \[1, 64\]"),
    (dict(window=16, num_draft=8), r"num_draft = 8 must be in \[0, 7\]"),
    (dict(window=4, num_draft=-1), r"num_draft = -1 must be in \[0, 3\]"),
    (dict(window=4, num_draft=2, drafter="none"),
     "drafter='none' proposes no drafts: num_draft must be 0, got 2"),
    (dict(drafter="ngram"), "drafter='ngram' proposes num_draft >= 1 tokens per step"),
    (dict(drafter="mtp"), "drafter='mtp' proposes num_draft >= 1 tokens per step"),
    (dict(window=4, num_draft=2, drafter="eagle"),
     "drafter must be one of 'none', 'ngram', 'mtp', 'draft', got 'eagle'"),
    (dict(ssm_mode="fast"), "ssm_mode must be 'replay' or 'standard', got 'fast'"),
    (dict(impl="cuda"), "impl must be one of 'auto', 'pallas', 'xla', 'pallas_triton', "
                        "'pallas_mosaic_gpu', got 'cuda'"),
    (dict(state_dtype=jnp.float16), "state_dtype must be float32 or bfloat16"),
    (dict(state_dtype=jnp.int32), "state_dtype must be float32 or bfloat16"),
    (dict(state_dtype="bogus"), "state_dtype must be float32 or bfloat16 .*'bogus'"),
])
def test_bad_settings(model, kw, match):
    with pytest.raises(ValueError, match=match) as e:
        Engine(model, **kw)
    _one_line(e)


@pytest.mark.parametrize("args,kw,match", [
    ((None,), {}, "model must be a loaded model .* got a NoneType"),
    (("some/dir",), {}, "model must be a loaded model .* got a str"),
    ((), dict(mesh="x"), "mesh must be a jax.sharding.Mesh .* got a str"),
])
def test_wrong_kinds_of_objects(model, args, kw, match):
    with pytest.raises(TypeError, match=match) as e:
        Engine(*(args or (model,)), **kw)
    _one_line(e)


def test_a_bad_or_failing_callback_leaves_the_engine_usable(engine):
    """on_tokens that is not callable is refused before anything is queued; one that raises
    propagates its error, and the engine is idle again (its requests cancelled)."""
    with pytest.raises(TypeError, match="on_tokens must be callable or None, got a int"):
        engine.generate([_req()], on_tokens=5)
    assert not engine.has_work

    def fail(*_):
        raise KeyError("the caller's bug")

    with pytest.raises(KeyError, match="the caller's bug"):
        engine.generate([_req(), _req(id="y")], on_tokens=fail)
    assert not engine.has_work
    assert engine.generate([_req()])[0].finish_reason == "length"
    assert not engine.cancel([1])               # no request has an unhashable id


def test_draft_model_needs_the_draft_drafter(model):
    for kw in (dict(), dict(window=4, num_draft=2)):
        with pytest.raises(ValueError, match="draft_model is only used with drafter='draft'"):
            Engine(model, draft_model=model, **kw)


def _req(**kw):
    return Request(**{"prompt": [1, 2, 3], "max_new_tokens": 4, "id": "x", **kw})


@pytest.mark.parametrize("req,match", [
    (_req(prompt=[]), "request 'x': empty prompt"),
    (_req(prompt=[1, 500, -2]), r"token ids \[500, -2\] out of the vocabulary \[0, 128\)"),
    (_req(prompt=[1, 2.5]), "prompt must be a sequence of integer token ids"),
    (_req(prompt=[[1, 2]]), "prompt must be a sequence of integer token ids"),
    (_req(prompt="abc"), "prompt must be a sequence of integer token ids"),
    (_req(max_new_tokens=0), "max_new_tokens must be >= 1, got 0"),
    (_req(max_new_tokens=2.0), "max_new_tokens must be an integer, got 2.0"),
    (_req(prompt=[1] * 50, max_new_tokens=13),
     r"prompt \(50\) \+ max_new_tokens \(13\) \+ drafts \(2\) = 65 exceeds the cache length "
     r"max_len = 64"),
    (_req(stop_ids=(5, 200)), r"stop_ids \[200\] out of the vocabulary \[0, 128\)"),
    (_req(stop_ids=5), "stop_ids must be a sequence of integer token ids, got 5"),
    (_req(stop_ids=None), "stop_ids must be a sequence of integer token ids, got None"),
    (_req(sampling=SamplingParams(temperature=-1)),
     r"sampling.temperature must be a finite number >= 0 \(0 = greedy\), got -1"),
    (_req(sampling=SamplingParams(temperature=math.inf)), "sampling.temperature must be"),
    (_req(sampling=SamplingParams(temperature=math.nan)), "sampling.temperature must be"),
    (_req(sampling=SamplingParams(top_k=-1)),
     r"sampling.top_k must be an integer in \[0, 2\^31\) \(0 = off\), got -1"),
    (_req(sampling=SamplingParams(top_k=2.5)), r"sampling.top_k must be an integer in"),
    # (an int32 array on device: a larger one would fail the engine's step, not the request)
    (_req(sampling=SamplingParams(top_k=2 ** 31)), r"sampling.top_k must be an integer in"),
    (_req(sampling=SamplingParams(top_p=2)), r"sampling.top_p must be a number in \(0, 1\]"),
    (_req(sampling=SamplingParams(temperature=0.8, top_p=-1)), r"sampling.top_p must be"),
    (_req(sampling=SamplingParams(top_p=0)), r"sampling.top_p must be"),
    (_req(sampling=SamplingParams(seed=-1)), r"sampling.seed must be an integer in \[0, 2\^31\)"),
    (_req(sampling=SamplingParams(seed=2 ** 31)), r"sampling.seed must be an integer"),
    (_req(sampling=dict(temperature=1)), "sampling must be a SamplingParams, got a dict"),
    (_req(id=[1]), "request id must be hashable, got a list"),
])
def test_bad_requests(engine, req, match):
    with pytest.raises(RequestError, match=match) as e:
        engine.submit(req)
    msg = _one_line(e)
    assert msg.startswith("request 'x': ") or "hashable" in msg
    assert not engine.has_work


def test_a_bad_request_queues_nothing(engine):
    """generate checks every request before queueing any; submit refuses an id in use."""
    with pytest.raises(RequestError, match="request 1: empty prompt"):
        engine.generate([_req(id=None), _req(prompt=[], id=None)])
    assert not engine.has_work
    with pytest.raises(RequestError, match="expected a Request, got a dict"):
        engine.submit({"prompt": [1, 2], "max_new_tokens": 3})
    engine.submit(_req())
    with pytest.raises(RequestError, match="request 'x': id already used by a queued or running"):
        engine.submit(_req())
    with pytest.raises(RuntimeError, match="generate / serve need an idle engine"):
        engine.generate([_req(id="y")])
    assert engine.cancel("x") and engine.step()[0].completion.finish_reason == "cancelled"
    assert not engine.has_work


def test_fresh_ids_are_not_reused(engine):
    """A request without an id gets the next integer; a finished request's id stays unused, so
    a late cancel cannot hit a newer request."""
    first = engine.submit(_req(id=None))
    assert engine.cancel(first) and engine.step()[0].id == first
    assert not engine.cancel(first)
    second = engine.submit(_req(id=None))
    assert second == first + 1
    assert engine.cancel(second) and engine.step()[0].completion.tokens == []
    assert not engine.has_work


def test_a_failed_prefill_fails_its_requests_only(model, monkeypatch):
    """A prefill call that raises before it runs (at compilation or dispatch: no donated
    buffer consumed) finishes its requests with finish_reason "error" saying why, and the
    engine serves the next ones as before; one that raises after consuming the engine's state
    propagates (the engine cannot go on)."""
    engine = Engine(model, num_slots=2, max_len=64, window=4)
    real = engine._prefill

    def refuse(state, tokens, *rest):
        if int(tokens[0, 0]) == 7:
            raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 206396819016 "
                               "bytes.")
        return real(state, tokens, *rest)

    monkeypatch.setattr(engine, "_prefill", refuse)
    monkeypatch.setattr(engine, "_prefill_shortfall", lambda *a: None)   # (a plain function)
    want = Engine(model, num_slots=2, max_len=64, window=4).generate([Request([5, 1, 2], 6)])
    bad, = engine.generate([Request([7, 1, 2], 6, id="bad")])
    assert (bad.finish_reason, bad.tokens) == ("error", [])
    assert bad.error == ("the prefill failed (RuntimeError: RESOURCE_EXHAUSTED: Out of memory "
                         "allocating 206396819016 bytes.)")
    good, = engine.generate([Request([5, 1, 2], 6)])
    assert (good.finish_reason, good.tokens) == ("length", want[0].tokens)

    def lose(state, *args):
        real(state, *args)                      # the state donated, then a failure
        raise RuntimeError("lost")

    monkeypatch.setattr(engine, "_prefill", lose)
    with pytest.raises(RuntimeError, match="lost"):
        engine.generate([Request([5, 1, 2], 6)])


def test_a_prefill_past_free_memory_is_refused_before_it_runs(model, monkeypatch):
    """A prefill shape whose executable would allocate more than is free (XLA's memory
    analysis, once a shape) does not run: its prompt finishes with finish_reason "error"
    naming the need; a shorter prompt batched with it goes back to the queue and is served as
    alone; the engine goes on."""
    engine = Engine(model, num_slots=2, max_len=64, window=4)
    want = Engine(model, num_slots=2, max_len=64, window=4).generate([Request([5, 1, 2], 6)])
    real = engine._prefill.extra_bytes
    seen = []

    def extra_bytes(state, tokens, *args):
        seen.append(tokens.shape)
        return 10 ** 15 if tokens.shape[1] >= 32 else real(state, tokens, *args)

    monkeypatch.setattr(engine._prefill, "extra_bytes", extra_bytes)
    long, short = engine.generate([Request([3] * 40, 6, id="long"), Request([5, 1, 2], 6)])
    assert (long.finish_reason, long.tokens) == ("error", [])
    assert long.error.startswith("a prompt of 40 tokens cannot be prefilled here: its prefill "
                                 "needs ~1000000.0 GB; the ")
    assert (short.finish_reason, short.tokens) == ("length", want[0].tokens)
    assert [T for _, T in seen] == [64, 16]          # each shape checked once
    again, = engine.generate([Request([3] * 40, 2)])
    assert again.finish_reason == "error" and [T for _, T in seen] == [64, 16]


def test_a_prefill_that_does_not_compile_fails_its_requests_only(model, monkeypatch):
    """A prefill whose compilation raises (seen by the memory check, which compiles it first)
    finishes its requests with finish_reason "error"; the engine goes on."""
    engine = Engine(model, num_slots=2, max_len=64, window=4)
    real = engine._prefill.extra_bytes

    def extra_bytes(state, tokens, *args):
        if tokens.shape[1] >= 32:
            raise ValueError("cannot lower")
        return real(state, tokens, *args)

    monkeypatch.setattr(engine._prefill, "extra_bytes", extra_bytes)
    bad, = engine.generate([Request([3] * 40, 2)])
    assert (bad.finish_reason, bad.error) == ("error",
                                              "the prefill failed (ValueError: cannot lower)")
    assert engine.generate([Request([5, 1, 2], 2)])[0].finish_reason == "length"
