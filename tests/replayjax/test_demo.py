"""The demo model shipped in replayjax/demo/model (trained by scripts/train_demo.py), on CPU:
it loads through `replayjax.loading.load_model` (MTP head included), its byte-level tokenizer
round-trips text, greedy decoding from a training-text prompt gives printable licence-like text,
its loss on a sentence of the held-out licence (LGPL-3) is far below uniform, and ReplaySSM,
standard and MTP-speculative greedy decoding give the same tokens."""

import json
import math
import os
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from models.runner import Runner
from replayjax import generate_cli
from replayjax.demo import model_dir
from replayjax.engine import Engine, Request
from replayjax.loading import load_model

PROMPT = "This program is free software; you can redistribute it"     # GPL-2/3 (trained on)
HELD_OUT = ("  This version of the GNU Lesser General Public License incorporates\n"
            "the terms and conditions of version 3 of the GNU General Public\n"
            "License, supplemented by the additional permissions listed below.\n")   # LGPL-3
N_NEW = 40


@pytest.fixture(scope="module")
def model():
    return load_model(model_dir())


@pytest.fixture(scope="module")
def greedy(model):
    """Greedy continuation of PROMPT with the default engine (ReplaySSM decode)."""
    [c] = Engine(model, num_slots=1, max_len=128).generate(
        [Request(prompt=list(PROMPT.encode()), max_new_tokens=N_NEW)])
    return c.tokens


def test_shipped_files():
    d = model_dir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "provenance.json"):
        assert os.path.isfile(os.path.join(d, name)), name
    size = sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d))
    assert size < 8e6, f"the demo directory should stay a few MB, is {size / 1e6:.1f} MB"
    with open(os.path.join(d, "provenance.json")) as f:
        prov = json.load(f)
    assert prov["texts"] and all(len(t["sha256"]) == 64 for t in prov["texts"])


def test_loads_as_hybrid_with_mtp(model):
    cfg = model.cfg
    assert cfg.family == "nemotron_h" and cfg.vocab_size == 256
    assert {"mamba", "attention"} <= set(cfg.layer_kinds)
    assert model.mtp is not None


def test_tokenizer_is_bytes():
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(os.path.join(model_dir(), "tokenizer.json"))
    for text in (PROMPT, HELD_OUT, "Grüße, naïve café ✓ 日本語 🙂\n\t x", ""):
        ids = tok.encode(text).ids
        assert ids == list(text.encode("utf-8"))
        assert tok.decode(ids) == text


def test_greedy_text_is_printable(greedy):
    text = bytes(greedy).decode("utf-8", errors="replace")
    printable = sum(32 <= t < 127 or t == 10 for t in greedy) / len(greedy)
    assert len(greedy) == N_NEW and printable >= 0.9, text
    words = [w for w in text.split() if w.strip(",.;:()\"'").isalpha()]
    assert len(words) >= 4, text


def test_held_out_loss_well_below_uniform(model):
    ids = list(HELD_OUT.encode())
    runner = Runner(model)
    logits, _ = runner.prefill(runner.init_cache(2, len(ids)), jnp.asarray([ids], jnp.int32),
                               jnp.asarray([len(ids)], jnp.int32), jnp.asarray([1], jnp.int32))
    lp = np.asarray(logits[0, :-1], np.float64)
    lp = lp - lp.max(-1, keepdims=True)
    lp = lp - np.log(np.exp(lp).sum(-1, keepdims=True))
    nll = -float(np.mean(lp[np.arange(len(ids) - 1), ids[1:]]))
    assert nll < 2.0 < math.log(256), nll


@pytest.mark.parametrize("kw", [dict(ssm_mode="standard"),
                                dict(num_draft=3, drafter="mtp")], ids=["standard", "mtp"])
def test_decoders_agree(model, greedy, kw):
    [c] = Engine(model, num_slots=1, max_len=128, **kw).generate(
        [Request(prompt=list(PROMPT.encode()), max_new_tokens=N_NEW)])
    assert c.tokens == greedy
    if kw.get("drafter") == "mtp":    # a trained head: a good share of its drafts are accepted
        assert c.accepted_drafts >= N_NEW // 4, (c.accepted_drafts, c.verify_steps)


def test_generate_without_model_uses_the_demo(capsys):
    """`replayjax generate --prompt TEXT` with no --model runs the shipped demo and prints text."""
    from replayjax import generate_cli
    assert generate_cli.main(["--prompt", "This program is free software; ",
                              "--max-new-tokens", "24", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["results"]
    assert row["prompt_ids"] == list(b"This program is free software; ")
    assert len(row["tokens"]) == 24
    assert row["text"] == bytes(row["tokens"]).decode("utf-8", "replace")
    assert sum(c.isalpha() or c.isspace() for c in row["text"]) >= 20


def test_converted_demo_generates_the_same_text(tmp_path, capsys):
    """The demo converts (with its MTP head and tokenizer files) and the converted directory
    generates the same text from a text prompt as the shipped HF one."""
    import convert
    from replayjax import generate_cli
    out = tmp_path / "demo"
    summary = convert.convert(model_dir(), str(out))
    assert summary["mtp"] and (out / "tokenizer.json").read_bytes() == \
        (Path(model_dir()) / "tokenizer.json").read_bytes()
    texts = []
    for d in (model_dir(), str(out)):
        assert generate_cli.main(["--model", d, "--prompt", "The licenses for most software ",
                                  "--max-new-tokens", "16", "--json"]) == 0
        texts.append(json.loads(capsys.readouterr().out)["results"][0]["text"])
    assert texts[0] == texts[1]


def test_stream_prints_what_generate_prints(capsys):
    """--stream writes the text visit by visit; the result is the batch output's text."""
    from replayjax import generate_cli
    argv = ["--prompt", "This program is free software; ", "--max-new-tokens", "20",
            "--steps-per-visit", "3"]
    outs = []
    for extra in ([], ["--stream"]):
        assert generate_cli.main(argv + extra) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and len(outs[0].strip()) >= 10


def test_stream_printer_holds_back_split_characters():
    """Byte tokens of a multi-byte character arrive in different visits: the printer writes the
    character once it is whole, never a replacement character."""
    import io

    from tokenizers import Tokenizer

    from replayjax.generate_cli import _Printer
    out = io.StringIO()
    printer = _Printer(Tokenizer.from_file(str(Path(model_dir()) / "tokenizer.json")), out)
    ids = list("naïve café €".encode())
    seen = []
    for k, t in enumerate(ids):
        printer("r", [t], k == len(ids) - 1)
        seen.append(out.getvalue())
    assert out.getvalue() == "naïve café €\n"
    assert all("\ufffd" not in s for s in seen) and seen[2] == "na" and seen[3] == "naï"


def test_prompt_ids_get_text_when_the_model_has_a_tokenizer(capsys):
    from replayjax import generate_cli
    assert generate_cli.main(["--prompt-ids", ",".join(map(str, b"GNU ")), "--max-new-tokens",
                              "8", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["results"]
    assert row["text"] == bytes(row["tokens"]).decode("utf-8", "replace")


def test_generate_runs_the_demo_in_float32_so_speculation_keeps_greedy_text(capsys):
    """Without --model the demo runs in float32: a prompt whose greedy text in bf16 reaches an
    exact logit tie (tokens 100 and 116) gives the same text with and without speculation."""
    ids = ",".join(map(str, np.random.default_rng(1).integers(3, 256, 150).tolist()[:30]))
    texts = []
    for extra in ([], ["--speculative", "ngram", "--num-draft", "1"],
                  ["--speculative", "mtp", "--num-draft", "3"]):
        assert generate_cli.main(["--prompt-ids", ids, "--max-new-tokens", "20", "--json",
                                  *extra]) == 0
        texts.append(json.loads(capsys.readouterr().out)["results"][0]["text"])
    assert texts[0] == texts[1] == texts[2], texts
