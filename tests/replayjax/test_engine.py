"""The engine on the tiny HF fixtures (CPU): greedy outputs equal HF's, continuous batching does
not change a request's output, replay == standard, speculative (n-gram) == plain decoding in both
SSM modes (standard: the state-per-draft baseline),
seeded sampling is batch-independent, bad requests are refused with a clear message."""

import pytest

from replayjax.drafters import ngram_drafts
from replayjax.engine import Engine, Request, RequestError, SamplingParams
from tests.models.hf_checks import load


@pytest.fixture(scope="module", params=["nemotron_h", "qwen3_next"])
def fixture(request):
    runner, ref = load(request.param)
    prompts = [list(p[:n]) for p, n in zip(ref["prompts"], ref["prompt_lens"])]
    return runner.model, prompts, ref["greedy_tokens"]


def _greedy_requests(prompts, lengths):
    return [Request(prompt=p, max_new_tokens=n, id=f"r{i}") for i, (p, n) in
            enumerate(zip(prompts, lengths))]


@pytest.mark.parametrize("mode,num_draft,invariant", [
    ("replay", 0, True), ("standard", 0, True), ("replay", 3, True), ("standard", 3, True),
    ("standard", 3, False)])
def test_continuous_batching_reproduces_hf_greedy(fixture, mode, num_draft, invariant):
    """Six requests through two slots (admitted as others finish), different lengths: every
    output is HF's greedy continuation of its prompt (also with rows = running slots, row !=
    slot, in the state-per-draft baseline's remapped rows)."""
    model, prompts, want = fixture
    order = [0, 1, 2, 2, 0, 1]
    lengths = [40, 7, 23, 40, 3, 31]
    eng = Engine(model, num_slots=2, max_len=128, ssm_mode=mode, window=4, steps_per_visit=5,
                 num_draft=num_draft, batch_invariant=invariant)
    out = eng.generate(_greedy_requests([prompts[i] for i in order], lengths))
    for c, i, n in zip(out, order, lengths):
        assert c.tokens == list(want[i, :n]) and c.finish_reason == "length"
        assert 0 <= c.ttft_s <= c.completion_s
    if num_draft:
        assert all(c.verify_steps > 0 for c in out)
        if model.cfg.family == "nemotron_h":    # its greedy text repeats: n-grams hit (the Qwen
            assert sum(c.accepted_drafts for c in out) > 0     # fixture's does not)


@pytest.mark.parametrize("limits,calls", [(dict(prefill_rows=2), 3),
                                          (dict(prefill_tokens=1), 5)])
def test_prefill_in_row_chunks(fixture, limits, calls):
    """Five requests admitted at once into five slots but prefilled two rows per call, or one
    per call when a row's length bucket alone exceeds the positions budget (bounded prefill
    memory): outputs still equal HF's greedy continuations."""
    model, prompts, want = fixture
    order, lengths = [0, 1, 2, 1, 0], [9, 5, 12, 3, 7]
    eng = Engine(model, num_slots=5, max_len=128, window=4, **limits)
    out = eng.generate(_greedy_requests([prompts[i] for i in order], lengths))
    assert [c.tokens for c in out] == [list(want[i, :n]) for i, n in zip(order, lengths)]
    assert sum(kind == "prefill" for kind, *_ in eng.visits) == calls


def test_serve_yields_each_visit_before_running_it(fixture):
    """`serve` announces every host visit before it runs (what a profiler needs to trace decode
    steps only) and returns generate's completions; bad requests fail before anything runs."""
    model, prompts, want = fixture
    eng = Engine(model, num_slots=2, max_len=128, window=4, steps_per_visit=4, prefill_rows=1)
    visits = eng.serve(_greedy_requests(prompts[:3], [5, 9, 2]))
    kinds = []
    try:
        while True:
            kinds.append(next(visits))
            assert len(eng.visits) == len(kinds) - 1          # announced, not yet run
    except StopIteration as finished:
        out = finished.value
    assert [c.tokens for c in out] == [list(want[i, :n]) for i, n in enumerate([5, 9, 2])]
    assert kinds == [kind for kind, *_ in eng.visits] and kinds[:2] == ["prefill", "prefill"]
    assert kinds.count("prefill") == 3 and "decode" in kinds
    with pytest.raises(RequestError, match="empty prompt"):
        eng.serve([Request(prompt=[], max_new_tokens=1)])
    assert len(eng.visits) == len(kinds)


@pytest.mark.parametrize("num_draft", [0, 3])
def test_streamed_tokens_add_up_to_the_completions(fixture, num_draft):
    """on_tokens gets each request's tokens visit by visit, cut at the stop id / max_new_tokens
    like the Completion (nothing generated past them leaks out), and `finished` exactly once,
    last; a long request streams over several visits."""
    model, prompts, want = fixture
    stop = int(want[1, 6])                        # the 7th greedy token of prompt 1
    reqs = [Request(prompt=prompts[0], max_new_tokens=23, id="a"),
            Request(prompt=prompts[1], max_new_tokens=30, stop_ids=(stop,), id="b"),
            Request(prompt=prompts[2], max_new_tokens=1, id="c")]
    calls = []
    eng = Engine(model, num_slots=2, max_len=128, window=4, steps_per_visit=3,
                 num_draft=num_draft)
    out = eng.generate(reqs, on_tokens=lambda i, toks, fin: calls.append((i, list(toks), fin)))
    for r, c in zip(reqs, out):
        mine = [(toks, fin) for i, toks, fin in calls if i == r.id]
        assert sum((toks for toks, _ in mine), []) == c.tokens
        assert [fin for _, fin in mine] == [False] * (len(mine) - 1) + [True]
    assert out[1].finish_reason == "stop" and out[1].tokens[-1] == stop
    assert out[0].tokens == list(want[0, :23])
    assert sum(i == "a" for i, *_ in calls) >= 3


@pytest.mark.parametrize("mode", ["replay", "standard"])
def test_bf16_state_keeps_hf_greedy_on_nemotron_h(mode):
    """A bf16 SSM state (half the state bytes) still reproduces HF's 40 greedy tokens on the
    Nemotron-H fixture in both SSM modes. (On the Qwen fixture one of three
    prompts meets a near-tie and diverges: bf16 state is a precision trade, fp32 is the default.)"""
    import jax.numpy as jnp
    runner, ref = load("nemotron_h")
    prompts = [list(p[:n]) for p, n in zip(ref["prompts"], ref["prompt_lens"])]
    eng = Engine(runner.model, num_slots=2, max_len=128, ssm_mode=mode, window=4,
                 state_dtype=jnp.bfloat16)
    out = eng.generate(_greedy_requests(prompts, [40] * len(prompts)))
    assert [c.tokens for c in out] == [list(w[:40]) for w in ref["greedy_tokens"]]
    ssm = next(lc for lc in eng.cache.layers if hasattr(lc, "buffers"))
    assert ssm.buffers.checkpoint.dtype == jnp.bfloat16


def test_stop_ids_end_a_request(fixture):
    model, prompts, want = fixture
    stop = int(want[0, 5])
    first = list(want[0]).index(stop)
    [c] = Engine(model, num_slots=2, max_len=128, window=4).generate(
        [Request(prompt=prompts[0], max_new_tokens=30, stop_ids=(stop,))])
    assert c.tokens == list(want[0, :first + 1]) and c.finish_reason == "stop"


def test_seeded_sampling_is_batch_independent(fixture):
    model, prompts, _ = fixture
    sp = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=7)
    alone = Engine(model, num_slots=1, max_len=128, window=4).generate(
        [Request(prompt=prompts[1], max_new_tokens=12, sampling=sp)])[0].tokens
    busy = Engine(model, num_slots=3, max_len=128, window=4).generate(
        [Request(prompt=prompts[0], max_new_tokens=20),
         Request(prompt=prompts[1], max_new_tokens=12, sampling=sp),
         Request(prompt=prompts[2], max_new_tokens=5, sampling=SamplingParams(0.5, seed=3))])
    assert busy[1].tokens == alone
    top1 = Engine(model, num_slots=1, max_len=128, window=4).generate(
        [Request(prompt=prompts[1], max_new_tokens=12,
                 sampling=SamplingParams(temperature=1.0, top_k=1, seed=1))])[0].tokens
    greedy = Engine(model, num_slots=1, max_len=128, window=4).generate(
        [Request(prompt=prompts[1], max_new_tokens=12)])[0].tokens
    assert top1 == greedy


@pytest.mark.parametrize("req,match", [
    (Request(prompt=[], max_new_tokens=4), "empty prompt"),
    (Request(prompt=[1, 500], max_new_tokens=4), r"token ids \[500\] out of the vocabulary"),
    (Request(prompt=[1] * 100, max_new_tokens=40), "exceeds the cache length max_len = 128"),
    (Request(prompt=[1, 2], max_new_tokens=0), "max_new_tokens must be >= 1"),
])
def test_bad_requests_are_refused(fixture, req, match):
    model, _, _ = fixture
    with pytest.raises(RequestError, match=match):
        Engine(model, num_slots=1, max_len=128, window=4).generate([req])


def test_bad_engine_settings(fixture):
    model, _, _ = fixture
    with pytest.raises(ValueError, match=r"num_draft = 9 must be in \[0, 3\]"):
        Engine(model, window=4, num_draft=9)
    with pytest.raises(ValueError, match="ssm_mode must be 'replay' or 'standard'"):
        Engine(model, ssm_mode="fast")
    with pytest.raises(ValueError, match="steps_per_visit must be >= 1, got 0"):
        Engine(model, steps_per_visit=0)


def test_ngram_drafter():
    assert ngram_drafts([5, 6, 7, 9, 5, 6], 3) == [7, 9, 5]
    assert ngram_drafts([1, 2, 3], 2) == [3, 3]
    assert ngram_drafts([4], 2) == [4, 4]


def _spy_rows(eng):
    """Records the row count of every decode and prefill call of `eng`."""
    rows = {"decode": [], "prefill": []}

    def spy(kind, f):
        def call(state, *args):
            rows[kind].append(args[0].shape[0] if kind == "prefill" else args[0].last.shape[0])
            return f(state, *args)
        call.extra_bytes = f.extra_bytes        # (the engine's memory check of a prefill)
        return call

    for kind in rows:
        setattr(eng, f"_{kind}", spy(kind, getattr(eng, f"_{kind}")))
    return rows


def test_dynamic_batch_steps_follow_the_load(fixture):
    """batch_invariant=False: a decode step runs one row per running request (padded to a
    power of two >= 8) and a prefill call one row per prompt (padded to a power of four), not
    the whole slot pool or prefill_rows, so their cost follows the load; outputs are HF's
    greedy continuations. By default every step has the pool's shape."""
    model, prompts, want = fixture
    eng = Engine(model, num_slots=40, max_len=128, window=4, steps_per_visit=4,
                 batch_invariant=False)
    rows = _spy_rows(eng)
    out = eng.generate(_greedy_requests(prompts[:1], [6]))
    assert out[0].tokens == list(want[0, :6])
    assert set(rows["decode"]) == {8} and rows["prefill"] == [1]
    rows["decode"].clear()
    lengths = [30] + [5] * 11                # the long one ends alone: the batch shrinks back
    out = eng.generate(_greedy_requests([prompts[i % 3] for i in range(12)], lengths))
    assert [c.tokens for c in out] == [list(want[i % 3, :n]) for i, n in enumerate(lengths)]
    assert rows["decode"][0] == 16 and rows["decode"][-1] == 8
    assert rows["prefill"][1:] == [16]        # 12 prompts, one call (prefill_rows 32)
    fixed = Engine(model, num_slots=40, max_len=128, window=4, steps_per_visit=4)
    rows = _spy_rows(fixed)
    assert fixed.generate(_greedy_requests(prompts[:1], [6]))[0].tokens == list(want[0, :6])
    assert set(rows["decode"]) == {fixed.S} and rows["prefill"] == [32]


def test_warm_up_buckets_compiles_every_prompt_length(fixture):
    """After `warm_up_buckets` (what `serve` runs before it listens), prompts of any length up
    to max_len compile nothing: no request stalls the running streams behind a compilation."""
    import jax
    model, _, _ = fixture
    eng = Engine(model, num_slots=2, max_len=128, window=4, steps_per_visit=4)
    eng.warm_up_buckets()
    compiles = []

    def listen(name, secs, **kw):
        if "backend_compile" in name:
            compiles.append(name)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        for n in (3, 17, 40, 90, 125):
            eng.generate([Request(prompt=[1] * n, max_new_tokens=3)])
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert compiles == []
