import json

import jax.numpy as jnp
import numpy as np

from models.config import load_config
from models.qwen import QwenHybrid
from models.runner import Runner
from replayjax import e2e_bench


def test_ab_bench_runs_every_variant(capsys):
    e2e_bench.main(["--model", "tests/fixtures/hf/qwen3_next", "--batch", "2", "--prompt-len", "6",
                    "--new-tokens", "10", "--window", "4", "--steps-per-visit", "4",
                    "--variants", "standard", "replay", "replay+ngram", "--json"])
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["variant"] for r in rows] == ["standard", "replay", "replay+ngram"]
    assert all(r["failures"] == 0 and r["tokens_per_s"] > 0 for r in rows)
    assert rows[2]["accepted_per_verify"] is not None


def test_randomize_gives_nondegenerate_weights():
    cfg = load_config("tests/fixtures/hf/qwen3_next")
    model = e2e_bench.randomize(QwenHybrid(cfg), seed=1)
    gdn = model.layers[0].mixer
    assert float(jnp.std(gdn.in_proj.kernel[...])) > 0.05
    dt = np.log1p(np.exp(np.asarray(gdn.dt_bias[...])))
    assert ((dt > 9e-4) & (dt < 0.11)).all()
    runner = Runner(model)
    logits, _ = runner.prefill(runner.init_cache(2, 16), jnp.ones((1, 4), jnp.int32),
                               jnp.asarray([4]), jnp.asarray([1], jnp.int32))
    assert np.isfinite(np.asarray(logits)).all() and float(jnp.std(logits)) > 0.1
