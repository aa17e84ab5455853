"""Runs the sampling tests against deliberately broken samplers and prints which tests catch
each one: every mutation must fail at least one test, every test must fail under at least one
mutation, and the unbroken re-implementation ("none") must pass them all.

    .venv/bin/python scripts/check_sampling_mutations.py              # all: ~9 x the tests' time
    .venv/bin/python scripts/check_sampling_mutations.py --jobs 9     # at once, on >= 16 cores
    .venv/bin/python scripts/check_sampling_mutations.py greedy no_renormalisation

Each mutation runs in its own process (jitted engine steps must trace the patched functions):
`replayjax.sampling.sample`, `verify_drafts` and `filtered_probs` are replaced by the
re-implementation below with one defect switched on. It mirrors replayjax/sampling.py, except
that no-renormalisation needs a draw that assumes a normalised distribution (an inverse-CDF
draw): `jax.random.categorical` on log-probabilities is invariant to scaling, so dropping the
division there changes nothing. Exit status 0 when the table is complete and clean.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = [
    "tests/replayjax/test_sampling.py::test_sample_draws_from_the_filtered_distribution",
    "tests/replayjax/test_sampling.py::test_rejection_sampling_fits_every_position",
    "tests/replayjax/test_sampling.py::test_draws_depend_only_on_seed_and_position",
    "tests/replayjax/test_engine_sampling.py",
]
MUTATIONS = {
    "none": "the re-implementation without a defect (must pass everything)",
    "greedy": "argmax instead of drawing, acceptance by exact match",
    "top_k_ignored": "top-k filter not applied",
    "top_p_ignored": "top-p filter not applied",
    "temperature_ignored": "logits not divided by the temperature",
    "window_position_0": "token after a rejection drawn from window position 0",
    "no_renormalisation": "residual not renormalised before an inverse-CDF draw",
    "residual_keeps_draft": "residual does not exclude the rejected draft",
    "bonus_wrong_position": "bonus token drawn from p_{K-1} instead of p_K",
}


def patch(bug):
    """Replaces replayjax.sampling's public functions by versions with defect `bug`."""
    import jax
    import jax.numpy as jnp

    from replayjax import sampling

    exact = sampling.filtered_probs

    def filtered_probs(logits, temperature, top_k, top_p):
        if bug == "temperature_ignored":
            temperature = jnp.ones_like(temperature)
        if bug == "top_k_ignored":
            top_k = jnp.zeros_like(top_k)
        if bug == "top_p_ignored":
            top_p = jnp.ones_like(top_p)
        return exact(logits, temperature, top_k, top_p)

    def draw(keys, probs):
        return jax.vmap(lambda k, p: jax.random.categorical(k, jnp.log(p)))(keys, probs)

    def sample(logits, temperature, top_k, top_p, keys):
        greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        if bug == "greedy":
            return greedy
        probs = filtered_probs(logits, jnp.where(temperature > 0, temperature, 1.0), top_k,
                               top_p)
        return jnp.where(temperature > 0, draw(keys, probs), greedy).astype(jnp.int32)

    def verify_drafts(logits, drafts, temperature, top_k, top_p, seeds, positions):
        b, T, V = logits.shape
        K, rows = T - 1, jnp.arange(b)
        if bug == "greedy":
            temperature = jnp.zeros_like(temperature)
        greedy = jnp.argmax(logits, axis=-1)
        temp = jnp.where(temperature > 0, temperature, 1.0)
        probs = jax.vmap(lambda lg: filtered_probs(lg, temp, top_k, top_p), in_axes=1,
                         out_axes=1)(logits)
        keys = jax.vmap(lambda s, p: jax.random.split(
            jax.random.fold_in(jax.random.key(s), p), T + 1))(seeds, positions)
        u = jax.vmap(jax.vmap(jax.random.uniform))(keys[:, :K])
        p_draft = jnp.take_along_axis(probs[:, :K], drafts[:, :, None], axis=-1)[..., 0]
        sampled = temperature > 0
        ok = jnp.where(sampled[:, None], u < p_draft, drafts == greedy[:, :K])
        n_ok = jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=1), axis=1)
        rejected = n_ok < K
        src = n_ok
        if bug == "window_position_0":
            src = jnp.where(rejected, 0, K)
        if bug == "bonus_wrong_position":
            src = jnp.where(rejected, n_ok, K - 1)
        p_next = probs[rows, src]
        rej_tok = drafts[rows, jnp.minimum(n_ok, K - 1)]
        residual = p_next
        if bug != "residual_keeps_draft":
            residual = jnp.where(rejected[:, None] & (jnp.arange(V) == rej_tok[:, None]), 0.0,
                                 p_next)
        if bug == "no_renormalisation":
            u_new = jax.vmap(jax.random.uniform)(keys[:, K])
            cdf = jnp.cumsum(residual, axis=-1)
            new = jnp.minimum(jax.vmap(jnp.searchsorted)(cdf, u_new), V - 1)
        else:
            new = draw(keys[:, K], residual / residual.sum(-1, keepdims=True))
        new = jnp.where(sampled, new, greedy[rows, n_ok])
        return (n_ok + 1).astype(jnp.int32), new.astype(jnp.int32)

    sampling.filtered_probs = filtered_probs
    sampling.sample = sample
    sampling.verify_drafts = verify_drafts


def run_one(bug, out_path, tests):
    """In this process: patch, run the tests, write {test: passed} to out_path."""
    import pytest

    patch(bug)
    results = {}

    class Recorder:
        def pytest_runtest_logreport(self, report):
            if report.when == "call" or report.failed:
                results[report.nodeid] = results.get(report.nodeid, True) and report.passed

    pytest.main(["-q", "-p", "no:cacheprovider", "--no-header", "-rN", *tests],
                plugins=[Recorder()])
    with open(out_path, "w") as f:
        json.dump(results, f)


def run_isolated(bug, tests):
    """run_one in a fresh process: {test node id: passed}, or None if it produced nothing."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        subprocess.run([sys.executable, __file__, "--run", bug, "--out", out, "--tests", *tests],
                       cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       env=dict(os.environ, PYTHONPATH=ROOT))
        if not os.path.exists(out):
            return None
        with open(out) as f:
            return json.load(f)


def _compact(node_ids):
    """'f.py::test[a]', 'f.py::test[b]' -> 'test[a,b]'."""
    params = {}
    for t in node_ids:
        name, _, param = t.split("::")[-1].partition("[")
        params.setdefault(name, []).append(param.rstrip("]"))
    return ", ".join(name + (f"[{','.join(p)}]" if any(p) else "") for name, p in params.items())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mutations", nargs="*", metavar="MUTATION",
                    help=f"subset to run (default: all): {', '.join(MUTATIONS)}")
    ap.add_argument("--tests", nargs="+", default=TESTS, help="pytest node ids to run")
    ap.add_argument("--jobs", type=int, default=1, help="mutations run at once (default 1)")
    ap.add_argument("--run", choices=MUTATIONS, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run:
        return run_one(args.run, args.out, args.tests)
    if unknown := [m for m in args.mutations if m not in MUTATIONS]:
        ap.error(f"unknown mutation(s) {', '.join(unknown)}; choose from {', '.join(MUTATIONS)}")
    chosen = args.mutations or list(MUTATIONS)
    with ThreadPoolExecutor(args.jobs) as pool:
        table = dict(zip(chosen, pool.map(lambda b: run_isolated(b, args.tests), chosen)))
    problems = [f"mutation {b}: the test run crashed" for b, r in table.items() if r is None]
    table = {b: r for b, r in table.items() if r is not None}
    print("| mutation | defect | tests failed | which |\n|---|---|---|---|")
    for bug, result in table.items():
        failed = [t for t, ok in result.items() if not ok]
        print(f"| {bug} | {MUTATIONS[bug]} | {len(failed)} of {len(result)} | "
              f"{_compact(failed) or '-'} |")
    tests = sorted({t for r in table.values() for t in r})
    problems += [f"'none' fails {t}" for t in tests if not table.get("none", {}).get(t, True)]
    problems += [f"mutation {b} is caught by no test" for b in table
                 if b != "none" and all(table[b].values())]
    if set(table) == set(MUTATIONS):
        problems += [f"test {t} catches no mutation" for t in tests
                     if all(table[b].get(t, True) for b in table if b != "none")]
    print("\n".join(problems) or "every mutation is caught; every test catches one")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
