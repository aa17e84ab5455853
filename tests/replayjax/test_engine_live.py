"""The step-wise engine core on the Nemotron-H fixture (CPU): requests submitted at random host
visits get the tokens `generate` gives them at t = 0 (greedy: HF's; seeded sampling: the same
draws), a cancelled request stops at once and frees its slot, a thread submitting and cancelling
while another steps loses nothing, and more than eight stop ids stop the device loop."""

import math
import random
import threading
import time
from collections import defaultdict, deque

import numpy as np
import pytest

from replayjax.engine import Engine, Request, SamplingParams
from tests.models.hf_checks import load


@pytest.fixture(scope="module")
def fixture():
    runner, ref = load("nemotron_h")
    prompts = [list(p[:n]) for p, n in zip(ref["prompts"], ref["prompt_lens"])]
    return runner.model, prompts, ref["greedy_tokens"]


@pytest.fixture(scope="module")
def engine(fixture):
    """One engine for the module (its steps compile once); every test leaves it idle."""
    return Engine(fixture[0], num_slots=2, max_len=128, window=4, steps_per_visit=3)


class Collector:
    """Events -> tokens streamed and Completions per request id."""

    def __init__(self):
        self.tokens, self.done = defaultdict(list), {}

    def __call__(self, events):
        for ev in events:
            assert ev.id not in self.done, f"{ev.id!r}: an event after its completion"
            self.tokens[ev.id] += ev.tokens
            if ev.finished:
                self.done[ev.id] = ev.completion
                assert self.tokens[ev.id] == ev.completion.tokens
        return events


def _requests(prompts):
    sampled = [SamplingParams(temperature=0.8, top_k=20, seed=5), SamplingParams(1.0, seed=9)]
    specs = [(0, 17, None), (1, 5, sampled[0]), (2, 11, None), (0, 3, None), (1, 14, sampled[1]),
             (2, 8, None)]
    return [Request(prompt=prompts[i], max_new_tokens=n, sampling=sp or SamplingParams(),
                    id=f"r{k}") for k, (i, n, sp) in enumerate(specs)]


@pytest.mark.parametrize("num_draft", [0, 3])
def test_arrivals_at_random_visits_match_generate(fixture, engine, num_draft):
    model, prompts, want = fixture
    eng = engine if num_draft == 0 else Engine(model, num_slots=2, max_len=128, window=4,
                                               num_draft=num_draft)
    ref = {c.id: c.tokens for c in eng.generate(_requests(prompts))}
    for r in _requests(prompts):
        if r.sampling.temperature == 0:
            assert ref[r.id] == list(want[int(r.id[1:]) % 3, :r.max_new_tokens])
    rng = np.random.default_rng(num_draft)
    pending, got = deque(_requests(prompts)), Collector()
    while pending or eng.has_work:
        for _ in range(min(int(rng.integers(0, 3)), len(pending))):
            eng.submit(pending.popleft())
        got(eng.step())
    assert {i: c.tokens for i, c in got.done.items()} == ref
    assert all(c.finish_reason == "length" for c in got.done.values())


def test_cancel_drops_queued_and_frees_running(fixture, engine):
    _, prompts, want = fixture
    ids = [engine.submit(Request(prompt=prompts[i], max_new_tokens=n)) for i, n in
           [(0, 30), (1, 30), (2, 6), (0, 6)]]
    assert ids == [0, 1, 2, 3]                       # fresh ids for requests without one
    got = Collector()
    got(engine.step())                               # prefill of 0 and 1 (two slots)
    got(engine.step())                               # a decode visit: 3 more tokens each
    assert got.tokens[0] == list(want[0, :4])
    assert engine.cancel(3) and engine.cancel(0)     # 3 is queued, 0 running
    assert not engine.cancel("nope")
    n = len(engine.visits)
    fin = got(engine.step())
    assert [(ev.id, ev.tokens, ev.completion.finish_reason) for ev in fin[:2]] == [
        (3, [], "cancelled"), (0, [], "cancelled")]
    assert math.isnan(got.done[3].ttft_s)
    assert got.done[0].tokens == list(want[0, :4]) and got.done[0].ttft_s > 0
    assert [k for k, *_ in engine.visits[n:]] == ["prefill"]     # 2 took 0's slot at once
    assert got.tokens[2] == [want[2, 0]]
    while engine.has_work:
        got(engine.step())
    assert got.done[1].tokens == list(want[1, :30]) and got.done[2].tokens == list(want[2, :6])
    assert 3 not in got.tokens or got.tokens[3] == []
    assert not engine.cancel(0) and not engine.cancel(1)         # finished: unknown now


def test_a_thread_submitting_while_another_steps_loses_nothing(fixture, engine):
    """The engine thread steps (waiting when idle); another thread submits requests at random
    times and cancels one of them: every request completes exactly once, with HF's greedy
    tokens, or -- the cancelled one, unless it had finished already -- a prefix of them."""
    _, prompts, want = fixture
    specs = [(k % 3, 40 if k == 4 else 4 + 3 * k) for k in range(8)]
    reqs = [Request(prompt=prompts[i], max_new_tokens=n, id=f"t{k}") for k, (i, n) in
            enumerate(specs)]
    errors, cancelled = [], []

    def submitter():
        try:
            rng = random.Random(0)
            for k, r in enumerate(reqs):
                time.sleep(rng.uniform(0, 0.05))
                assert engine.submit(r) == r.id
                if k == 5:
                    cancelled.append(engine.cancel("t4"))
        except BaseException as e:          # reported by the stepping thread
            errors.append(e)
            raise

    thread = threading.Thread(target=submitter)
    thread.start()
    got, deadline = Collector(), time.monotonic() + 600
    while len(got.done) < len(reqs):
        assert not errors and time.monotonic() < deadline
        if engine.wait_for_work(timeout=1):
            got(engine.step())
    thread.join()
    assert not engine.has_work and sorted(got.done) == sorted(r.id for r in reqs)
    for r, (i, n) in zip(reqs, specs):
        c = got.done[r.id]
        if r.id == "t4" and cancelled == [True] and c.finish_reason != "length":
            # (a visit already on the device when the cancel came may finish it by length)
            assert c.finish_reason == "cancelled" and c.tokens == list(want[i, :len(c.tokens)])
        else:
            assert c.finish_reason == "length" and c.tokens == list(want[i, :n])


def test_more_than_eight_stop_ids_stop_on_device(fixture, engine):
    """Twelve stop ids, the one generated last: the request stops there (reason "stop") and the
    device loop ran no decode step past it."""
    _, prompts, want = fixture
    seq = [int(t) for t in want[0]]
    first = next(j for j in range(1, len(seq)) if j % 3 and seq[j] not in seq[:j])
    others = [t for t in range(128) if t not in seq][:11]
    engine.visits.clear()
    [c] = engine.generate([Request(prompt=prompts[0], max_new_tokens=40,
                                   stop_ids=tuple(others) + (seq[first],))])
    assert c.finish_reason == "stop" and c.tokens == seq[:first + 1]
    assert sum(n for kind, n, _ in engine.visits if kind == "decode") == first
