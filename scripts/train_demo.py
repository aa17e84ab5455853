#!/usr/bin/env python3
"""Train and export the demo model shipped in ``replayjax/demo/model/`` (what `replayjax generate`
uses when no --model is given).

The model is a tiny Nemotron-H-style hybrid (`models.nemotron_h.NemotronH`, built from the
``nemotron_h`` HF config in `CONFIG`): Mamba-2, attention and relu^2 MLP layers in the pattern
`PATTERN`, plus a one-block MTP head (attention + MLP) trained to predict the token after next.
The vocabulary is bytes: token id == byte value (256 ids, no special tokens).

Training text: the licence texts of Debian's ``base-files`` package,
``/usr/share/common-licenses/*`` (present on every Debian/Ubuntu install; symlinks skipped),
sorted by name, minus `HELD_OUT`, which is kept for a validation loss. Each file's sha256 goes
into ``provenance.json``. Next-byte cross entropy (+ `MTP_WEIGHT` x the MTP head's
next-next-byte loss) through ``model.prefill_hidden`` / ``model.draft`` (the same code the engine
runs), a hand-written Adam, fixed seed, fp32 on CPU.

Reproduce, from the repository root (about 1000 CPU-seconds: ~9 minutes on 2 idle cores, ~20 on
2 busy ones; then export and a sample generation):

    PYTHONPATH=. python scripts/train_demo.py

The run is seeded and, on the same machine and library versions, reproduces model.safetensors
bit for bit.

Writes ``replayjax/demo/model/``: config.json (transformers 5.x ``NemotronHForCausalLM``),
model.safetensors (hub tensor names, 2-D+ tensors bf16, vectors fp32; ``mtp.*`` tensors are ignored
by transformers and loaded by replayjax), tokenizer.json + tokenizer_config.json (byte-level,
``tokenizers``), generation_config.json and provenance.json (texts + sha256, steps, losses, seed,
command, date, sample generations).

Check against Hugging Face transformers (needs a venv with torch + transformers, not installed
here):

    PYTHONPATH=. python scripts/train_demo.py --check-hf --hf-python /tmp/hfvenv/bin/python

loads the exported directory with ``NemotronHForCausalLM.from_pretrained`` (fp32) in that venv,
and compares its logits on a few prompts with ours (`replayjax.loading.load_model` + prefill), and
the HF tokenizer's ids with the bytes.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(REPO, "replayjax", "demo", "model")
TEXT_DIR = "/usr/share/common-licenses"
HELD_OUT = "LGPL-3"                 # validation text (not trained on)

PATTERN = "M*M-M*M-"                # M = Mamba-2, * = attention, - = relu^2 MLP
MTP_PATTERN = ["full_attention", "mlp"]
MTP_WEIGHT = 0.3

CONFIG = {
    "architectures": ["NemotronHForCausalLM"],
    "model_type": "nemotron_h",
    "dtype": "bfloat16",
    "vocab_size": 256,
    "hidden_size": 256,
    "layers_block_type": [{"M": "linear_attention", "*": "full_attention", "-": "mlp"}[c]
                          for c in PATTERN],
    "tie_word_embeddings": False,
    "layer_norm_epsilon": 1e-5,
    "residual_in_fp32": False,
    "max_position_embeddings": 4096,
    # attention (no positional encoding in Nemotron-H)
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "sliding_window": None,
    # Mamba-2: I = 4 * 64 = 256 (expand 1), 2 groups, state 32 (powers of two for the Pallas tiles)
    "mamba_num_heads": 4,
    "mamba_head_dim": 64,
    "n_groups": 2,
    "ssm_state_size": 32,
    "conv_kernel": 4,
    "expand": 1,
    "mamba_hidden_act": "silu",
    "use_conv_bias": True,
    "mamba_proj_bias": False,
    "use_bias": False,
    "chunk_size": 128,
    "mamba_ssm_cache_dtype": "float32",
    # transformers clamps Delta >= time_step_min in prefill; the limit makes replayjax clamp the
    # same way everywhere (and the model is trained with it).
    "time_step_min": 0.001,
    "time_step_max": 0.1,
    "time_step_floor": 0.0001,
    "time_step_limit": [0.001, {"__float__": "Infinity"}],
    # relu^2 MLP
    "intermediate_size": 512,
    "mlp_hidden_act": "relu2",
    "mlp_bias": False,
    # MTP head (replayjax only; transformers ignores mtp.* tensors)
    "num_nextn_predict_layers": 1,
    "mtp_layers_block_type": MTP_PATTERN,
    # bytes: no special tokens
    "pad_token_id": None,
    "bos_token_id": None,
    "eos_token_id": None,
    "hidden_dropout": 0.0,
    "initializer_range": 0.02,
    "rescale_prenorm_residual": True,
    "use_cache": True,
    "num_logits_to_keep": 1,
}

CHECK_PROMPTS = [
    "This program is free software; you can redistribute it",
    "THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY",
    "Permission is hereby granted, free of charge, to any person",
    "Grüße: naïve café ✓ — not in the training text\n",
]
HF_GREEDY = 48
SAMPLE_PROMPTS = [
    "This program is free software; ",
    "The licenses for most software are designed to ",
    "Licensed under the Apache License",
]


# ----------------------------------------------------------------------------- data


def corpus(text_dir=TEXT_DIR, held_out=HELD_OUT):
    """(train bytes, validation bytes, provenance rows). Regular files only, sorted by name;
    files are joined with one blank line."""
    names = sorted(n for n in os.listdir(text_dir)
                   if os.path.isfile(os.path.join(text_dir, n))
                   and not os.path.islink(os.path.join(text_dir, n)))
    if held_out not in names:
        sys.exit(f"train_demo: {held_out!r} not found in {text_dir}")
    train, val, rows = [], b"", []
    for n in names:
        path = os.path.join(text_dir, n)
        with open(path, "rb") as f:
            data = f.read()
        rows.append(dict(path=path, bytes=len(data), sha256=hashlib.sha256(data).hexdigest(),
                         split="validation" if n == held_out else "train"))
        if n == held_out:
            val = data
        else:
            train.append(data.rstrip(b"\n") + b"\n\n")
    return b"".join(train), val, rows


# ----------------------------------------------------------------------------- model


def build_model(config=CONFIG):
    from models.config import parse_config
    from models.nemotron_h import NemotronH
    cfg = parse_config(config)
    return NemotronH(cfg, mtp=cfg.num_mtp_layers > 0)


def init_params(model, seed):
    """Random init in place: in-projections N(0, 1/fan_in), residual out-projections additionally
    / sqrt(2 * layers), embeddings N(0, 1), a small lm_head; Mamba: A in [1, 16], Delta
    log-uniform in [time_step_min, time_step_max], D = 1, conv U(+-1/sqrt(K))."""
    import jax.numpy as jnp
    cfg = model.cfg
    rng = np.random.default_rng(seed)
    depth = len(cfg.layer_kinds) + len(cfg.mtp_layer_kinds)

    def put(param, value):
        param[...] = jnp.asarray(value, param[...].dtype)

    def lin(layer, residual=False, gain=1.0):
        din, dout = layer.kernel[...].shape
        std = gain * din ** -0.5 / (math.sqrt(2 * depth) if residual else 1.0)
        put(layer.kernel, rng.normal(0.0, std, (din, dout)))

    def block(b):
        m = b.mixer
        if b.kind == "mamba":
            lin(m.in_proj)
            lin(m.out_proj, residual=True)
            C, K = m.conv_weight[...].shape
            put(m.conv_weight, rng.uniform(-K ** -0.5, K ** -0.5, (C, K)))
            put(m.conv_bias, rng.uniform(-K ** -0.5, K ** -0.5, (C,)))
            H = cfg.mamba_num_heads
            dt = np.exp(rng.uniform(np.log(cfg.time_step_min), np.log(cfg.time_step_max), H))
            dt = np.maximum(dt, cfg.time_step_floor)
            put(m.dt_bias, dt + np.log(-np.expm1(-dt)))        # inverse softplus
            put(m.A_log, np.log(rng.uniform(1.0, 16.0, H)))
        elif b.kind == "attention":
            for p in (m.q_proj, m.k_proj, m.v_proj):
                lin(p)
            lin(m.o_proj, residual=True)
        else:
            lin(m.up_proj)
            lin(m.down_proj, residual=True)

    put(model.embeddings, rng.normal(0.0, 1.0, model.embeddings[...].shape))
    for b in model.layers:
        block(b)
    lin(model.lm_head, gain=0.1)
    if model.mtp is not None:
        lin(model.mtp.eh_proj)
        for b in model.mtp.layers:
            block(b)


def _ce(logits, targets):
    import jax
    import jax.numpy as jnp
    lp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.mean(jnp.take_along_axis(lp, targets[..., None], axis=-1))


def make_fns(graphdef, *, peak_lr, steps, warmup, b1=0.9, b2=0.95, eps=1e-8,
             clip=1.0, mtp_weight=MTP_WEIGHT):
    """Jitted (train_step, losses). Sequences are [batch, T + 2] byte windows: the model reads the
    first T bytes and predicts bytes 1..T, the MTP head bytes 2..T + 1."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    def losses(params, seq):
        model = nnx.merge(graphdef, params)
        b, T = seq.shape[0], seq.shape[1] - 2
        slots = jnp.arange(1, b + 1, dtype=jnp.int32)
        cache = model.init_cache(b + 1, T)
        logits, hidden, cache = model.prefill_hidden(cache, seq[:, :T],
                                                     jnp.full((b,), T, jnp.int32), slots)
        main = _ce(logits, seq[:, 1:T + 1])
        if model.mtp is None:
            return main, jnp.zeros(())
        mlogits, _, _ = model.draft(cache, hidden, seq[:, 1:T + 1], slots,
                                    jnp.zeros((b,), jnp.int32))
        return main, _ce(mlogits, seq[:, 2:T + 2])

    def objective(params, seq):
        main, mtp = losses(params, seq)
        return main + mtp_weight * mtp, (main, mtp)

    def lr_at(step):                        # linear warm-up, cosine to 10 %
        t = jnp.clip((step - warmup) / max(steps - warmup, 1), 0.0, 1.0)
        cos = 0.1 + 0.9 * 0.5 * (1 + jnp.cos(jnp.pi * t))
        return peak_lr * jnp.where(step < warmup, (step + 1) / warmup, cos)

    def train_step(params, m, v, step, seq):
        (_, (main, mtp)), g = jax.value_and_grad(objective, has_aux=True)(params, seq)
        leaves = jax.tree.leaves(g)
        gnorm = jnp.sqrt(sum(jnp.sum(x * x) for x in leaves))
        scale = jnp.minimum(1.0, clip / (gnorm + 1e-12))
        g = jax.tree.map(lambda x: x * scale, g)
        m = jax.tree.map(lambda a, x: b1 * a + (1 - b1) * x, m, g)
        v = jax.tree.map(lambda a, x: b2 * a + (1 - b2) * x * x, v, g)
        t = (step + 1).astype(jnp.float32)
        lr = lr_at(step)
        c1, c2 = 1 - b1 ** t, 1 - b2 ** t
        params = jax.tree.map(lambda p, a, s: p - lr * (a / c1) / (jnp.sqrt(s / c2) + eps),
                              params, m, v)
        return params, m, v, main, mtp, gnorm

    return (jax.jit(train_step, donate_argnums=(0, 1, 2)), jax.jit(losses))


def windows(data, seq_len, stride=None):
    """Non-overlapping [n, seq_len + 2] windows of `data` (for evaluation)."""
    stride = stride or seq_len
    arr = np.frombuffer(data, np.uint8).astype(np.int32)
    starts = range(0, len(arr) - seq_len - 2 + 1, stride)
    return np.stack([arr[s:s + seq_len + 2] for s in starts])


def evaluate(eval_fn, params, wins, batch):
    """Mean (main, MTP) loss over the windows (whole batches only)."""
    tot_main = tot_mtp = 0.0
    n = 0
    for i in range(0, len(wins) - batch + 1, batch):
        main, mtp = eval_fn(params, wins[i:i + batch])
        tot_main, tot_mtp, n = tot_main + float(main), tot_mtp + float(mtp), n + 1
    return tot_main / n, tot_mtp / n


# ----------------------------------------------------------------------------- export


def round_bf16(model):
    """Rounds every >= 2-D parameter to bf16 (kept in fp32 containers): what the export stores."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    state = jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(x.dtype) if x.ndim >= 2 else x,
                         nnx.state(model))
    nnx.update(model, state)


def hf_tensors(model):
    """Hub-named tensors (inverse of the table in `convert.mappings.nemotron_h`): >= 2-D bf16,
    vectors fp32. Linear kernels [in, out] -> HF [out, in]; conv [C, K] -> [C, 1, K]."""
    import ml_dtypes
    out = {}

    def put(name, value):
        a = np.asarray(value, np.float32)
        out[name] = a.astype(ml_dtypes.bfloat16) if a.ndim >= 2 else a

    def linear(name, lin):
        put(f"{name}.weight", np.asarray(lin.kernel[...]).T)
        if lin.bias is not None:
            put(f"{name}.bias", lin.bias[...])

    def block(p, b):
        put(f"{p}.norm.weight", b.norm.weight[...])
        m, mp = b.mixer, f"{p}.mixer"
        if b.kind == "mamba":
            linear(f"{mp}.in_proj", m.in_proj)
            linear(f"{mp}.out_proj", m.out_proj)
            put(f"{mp}.conv1d.weight", np.asarray(m.conv_weight[...])[:, None, :])
            if m.conv_bias is not None:
                put(f"{mp}.conv1d.bias", m.conv_bias[...])
            for attr, name in (("dt_bias", "dt_bias"), ("A_log", "A_log"), ("D", "D"),
                               ("norm", "norm.weight")):
                put(f"{mp}.{name}", getattr(m, attr)[...])
        elif b.kind == "attention":
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                linear(f"{mp}.{proj}", getattr(m, proj))
        elif b.kind == "mlp":
            linear(f"{mp}.up_proj", m.up_proj)
            linear(f"{mp}.down_proj", m.down_proj)
        else:
            raise ValueError("the demo exporter has no MoE mapping")

    put("backbone.embeddings.weight", model.embeddings[...])
    for i, b in enumerate(model.layers):
        block(f"backbone.layers.{i}", b)
    put("backbone.norm_f.weight", model.norm_f.weight[...])
    linear("lm_head", model.lm_head)
    if model.mtp is not None:
        h = model.mtp
        put("mtp.layers.0.enorm.weight", h.enorm.weight[...])
        put("mtp.layers.0.hnorm.weight", h.hnorm.weight[...])
        linear("mtp.layers.0.eh_proj", h.eh_proj)
        for i, b in enumerate(h.layers):
            block(f"mtp.layers.{i}", b)
        put(f"mtp.layers.{len(h.layers) - 1}.final_layernorm.weight", h.final_layernorm.weight[...])
    return out


def _bytes_to_unicode():
    """GPT-2's byte -> printable unicode character table (what the ByteLevel pre-tokenizer uses)."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def byte_tokenizer():
    """A `tokenizers.Tokenizer` whose ids are the UTF-8 bytes: ByteLevel pre-tokenizer (no regex
    split, no prefix space), a merge-free BPE over the 256 byte characters with id == byte value,
    ByteLevel decoder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    table = _bytes_to_unicode()
    tok = Tokenizer(models.BPE(vocab={table[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    for text in ("Hello, world!\n\t  two  spaces", "Grüße, naïve café ✓ 日本語 🙂", "\x00\x7f"):
        ids = tok.encode(text).ids
        assert ids == list(text.encode("utf-8")), (text, ids)
        assert tok.decode(ids) == text, (text, tok.decode(ids))
    return tok


# `replayjax serve`'s /v1/chat/completions: "Role: content" lines, then "Assistant:" (the model
# knows no chat; the template only makes the endpoint work)
CHAT_TEMPLATE = ("{% for message in messages %}{{ message['role'] | capitalize }}: "
                 "{{ message['content'] or '' }}\n{% endfor %}"
                 "{% if add_generation_prompt %}Assistant:{% endif %}")


def write_export(model, out_dir, provenance):
    from safetensors.numpy import save_file
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
        f.write("\n")
    tensors = hf_tensors(model)
    save_file({k: tensors[k] for k in sorted(tensors)}, os.path.join(out_dir, "model.safetensors"))
    byte_tokenizer().save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096,
                   "clean_up_tokenization_spaces": False, "add_bos_token": False,
                   "add_eos_token": False, "chat_template": CHAT_TEMPLATE}, f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"do_sample": False, "max_new_tokens": 64}, f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "provenance.json"), "w") as f:
        json.dump(provenance, f, indent=2, ensure_ascii=False)
        f.write("\n")


def greedy_tokens(model, prompts, max_new_tokens, **engine_kw):
    """Greedy continuations (token lists) with the replayjax engine."""
    from replayjax.engine import Engine, Request
    eng = Engine(model, num_slots=len(prompts), max_len=512, **engine_kw)
    res = eng.generate([Request(prompt=list(p.encode()), max_new_tokens=max_new_tokens)
                        for p in prompts])
    return [c.tokens for c in res]


def generate_samples(model, prompts, max_new_tokens):
    return [bytes(t).decode("utf-8", errors="replace")
            for t in greedy_tokens(model, prompts, max_new_tokens)]


# ----------------------------------------------------------------------------- train


def train(args):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    t_start = time.time()
    train_text, val_text, files = corpus(args.text_dir)
    print(f"train text: {len(train_text)} bytes from {sum(r['split'] == 'train' for r in files)} "
          f"files; validation: {len(val_text)} bytes ({HELD_OUT})", flush=True)
    data = np.frombuffer(train_text, np.uint8).astype(np.int32)
    T, B = args.seq_len, args.batch

    model = build_model()
    init_params(model, args.seed)
    graphdef, params = nnx.split(model)
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    print(f"model: pattern {PATTERN} + MTP {MTP_PATTERN}, {n_params / 1e6:.2f}M parameters",
          flush=True)
    train_step, eval_fn = make_fns(graphdef, peak_lr=args.lr, steps=args.steps,
                                   warmup=args.warmup)
    m = jax.tree.map(jnp.zeros_like, params)
    v = jax.tree.map(jnp.zeros_like, params)
    rng = np.random.default_rng(args.seed)
    curve, ema, ema_mtp = [], None, None
    t0, c0 = time.time(), time.process_time()
    for step in range(args.steps):
        starts = rng.integers(0, len(data) - T - 2, size=B)
        seq = jnp.asarray(np.stack([data[s:s + T + 2] for s in starts]))
        params, m, v, main, mtp, gnorm = train_step(params, m, v, jnp.int32(step), seq)
        if step % 10 == 0 or step == args.steps - 1:
            main, mtp = float(main), float(mtp)
            ema = main if ema is None else 0.8 * ema + 0.2 * main
            ema_mtp = mtp if ema_mtp is None else 0.8 * ema_mtp + 0.2 * mtp
        if step % 50 == 0 or step == args.steps - 1:
            el = time.time() - t0
            curve.append(dict(step=step, loss=round(float(main), 4), mtp_loss=round(float(mtp), 4),
                              seconds=round(el, 1)))
            print(f"step {step:5d}  loss {float(main):.4f}  mtp {float(mtp):.4f}  "
                  f"(ema {ema:.4f} / {ema_mtp:.4f})  |g| {float(gnorm):.2f}  {el:6.1f}s",
                  flush=True)
    train_s, train_cpu = time.time() - t0, time.process_time() - c0
    print(f"trained {args.steps} steps in {train_s:.0f}s wall, {train_cpu:.0f} CPU-seconds",
          flush=True)
    nnx.update(model, params)

    ev_b = 8
    val_w, tr_w = windows(val_text, T), windows(train_text, T, stride=7 * T)[:64]
    val_fp32 = evaluate(eval_fn, params, val_w, ev_b)
    round_bf16(model)
    _, params = nnx.split(model)
    val_bf16 = evaluate(eval_fn, params, val_w, ev_b)
    train_bf16 = evaluate(eval_fn, params, tr_w, ev_b)
    print(f"validation ({HELD_OUT}) loss fp32 {val_fp32[0]:.4f} (mtp {val_fp32[1]:.4f}); "
          f"bf16 weights {val_bf16[0]:.4f} (mtp {val_bf16[1]:.4f}); train subset (bf16) "
          f"{train_bf16[0]:.4f}  [uniform: {math.log(256):.4f}]", flush=True)

    provenance = dict(
        description="replayjax demo model: tiny Nemotron-H-style byte-level hybrid LM "
                    "(Mamba-2 + attention + relu^2 MLP, MTP head), "
                    "trained by scripts/train_demo.py",
        command="PYTHONPATH=. python "
                + " ".join([os.path.relpath(sys.argv[0], REPO)] + sys.argv[1:]),
        date_utc=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        versions=dict(python=sys.version.split()[0], jax=jax.__version__,
                      flax=__import__("flax").__version__, numpy=np.__version__),
        devices=f"{jax.default_backend()} x{jax.device_count()} ({os.cpu_count()} CPUs visible)",
        pattern=PATTERN, mtp_pattern=MTP_PATTERN, parameters=n_params,
        texts=files, text_bytes=dict(train=len(train_text), validation=len(val_text)),
        objective=f"next-byte cross entropy + {MTP_WEIGHT} x MTP (byte after next) cross entropy",
        seed=args.seed, steps=args.steps, batch=B, seq_len=T,
        optimizer=dict(name="Adam (hand-written)", peak_lr=args.lr, warmup=args.warmup,
                       schedule="linear warm-up, cosine to 10%", betas=[0.9, 0.95], eps=1e-8,
                       grad_clip_norm=1.0, weight_decay=0.0),
        training_seconds=round(train_s, 1), training_cpu_seconds=round(train_cpu, 1),
        loss_curve=curve,
        final_train_loss_ema=round(ema, 4), final_train_mtp_loss_ema=round(ema_mtp, 4),
        validation_loss=dict(fp32=round(val_fp32[0], 4), bf16=round(val_bf16[0], 4),
                             mtp_bf16=round(val_bf16[1], 4), text=HELD_OUT, unit="nats/byte"),
        train_subset_loss_bf16=round(train_bf16[0], 4),
        export="tensors of >= 2 dims in bf16, vectors in fp32",
    )

    # export, then reload through the library's own loader and check it reproduces the weights
    write_export(model, args.out, provenance)
    from replayjax.loading import load_model
    loaded = load_model(args.out, dtype=jnp.float32)       # the trained model's dtype
    mine = jax.tree.leaves_with_path(nnx.state(model))
    theirs = jax.tree.leaves_with_path(nnx.state(loaded))
    assert [k for k, _ in mine] == [k for k, _ in theirs]
    for (k, a), (_, b) in zip(mine, theirs):
        assert np.array_equal(np.asarray(a), np.asarray(b)), jax.tree_util.keystr(k)
    samples = generate_samples(loaded, SAMPLE_PROMPTS, args.sample_tokens)
    for p, s in zip(SAMPLE_PROMPTS, samples):
        print(f"--- {p!r}\n{p}{s}", flush=True)
    provenance["samples_greedy"] = [dict(prompt=p, continuation=s)
                                    for p, s in zip(SAMPLE_PROMPTS, samples)]
    provenance["total_seconds"] = round(time.time() - t_start, 1)
    with open(os.path.join(args.out, "provenance.json"), "w") as f:
        json.dump(provenance, f, indent=2, ensure_ascii=False)
        f.write("\n")
    sizes = {n: os.path.getsize(os.path.join(args.out, n)) for n in sorted(os.listdir(args.out))}
    print("wrote", args.out, sizes, f"total {sum(sizes.values()) / 1e6:.2f} MB", flush=True)


# ----------------------------------------------------------------------------- HF check


def hf_logits(model_dir, out_path, prompts):
    """(runs in the transformers venv) fp32 logits of NemotronHForCausalLM and the HF tokenizer's
    ids, per prompt, into an npz."""
    import torch
    from transformers import AutoTokenizer, NemotronHForCausalLM
    torch.manual_seed(0)
    model = NemotronHForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    arrays = {}
    with torch.no_grad():
        for i, p in enumerate(prompts):
            ids = list(p.encode("utf-8"))
            arrays[f"logits_{i}"] = model(input_ids=torch.tensor([ids]),
                                          use_cache=False).logits[0].numpy()
            arrays[f"tok_{i}"] = np.asarray(tok(p, add_special_tokens=False)["input_ids"], np.int64)
            arrays[f"dec_{i}"] = np.frombuffer(tok.decode(ids).encode("utf-8"), np.uint8)
        ids = list(prompts[0].encode("utf-8"))
        out = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids)),
                             max_new_tokens=HF_GREEDY, do_sample=False, pad_token_id=0)
        arrays["greedy"] = out[0, len(ids):].numpy()
    np.savez(out_path, **arrays)


def check_hf(args):
    import tempfile

    import jax.numpy as jnp

    from models.runner import Runner
    from replayjax.loading import load_model
    model = load_model(args.out, dtype=jnp.float32)        # as transformers loads it here
    runner = Runner(model)
    with tempfile.TemporaryDirectory() as tmp:
        npz = os.path.join(tmp, "hf.npz")
        subprocess.run([args.hf_python, os.path.abspath(__file__), "--hf-logits", args.out, npz],
                       check=True, env=dict(os.environ, PYTHONPATH=""))
        ref = dict(np.load(npz))
    worst = 0.0
    ok = True
    for i, p in enumerate(CHECK_PROMPTS):
        ids = list(p.encode("utf-8"))
        cache = runner.init_cache(2, len(ids))
        logits, _ = runner.prefill(cache, jnp.asarray([ids], jnp.int32),
                                   jnp.asarray([len(ids)], jnp.int32), jnp.asarray([1], jnp.int32))
        ours, theirs = np.asarray(logits[0], np.float64), ref[f"logits_{i}"].astype(np.float64)
        rel = float(np.max(np.abs(ours - theirs)) / np.max(np.abs(theirs)))
        rel_l2 = float(np.linalg.norm(ours - theirs) / np.linalg.norm(theirs))
        agree = float(np.mean(ours.argmax(-1) == theirs.argmax(-1)))
        tok_ok = ref[f"tok_{i}"].tolist() == ids and bytes(ref[f"dec_{i}"]).decode() == p
        worst = max(worst, rel)
        ok &= tok_ok and rel < 1e-3
        print(f"prompt {i} ({len(ids)} bytes): max|diff|/max|logit| = {rel:.2e}, rel L2 = "
              f"{rel_l2:.2e}, argmax agreement {agree:.3f}, HF tokenizer ids == bytes: {tok_ok}")
    ours = bytes(greedy_tokens(model, CHECK_PROMPTS[:1], HF_GREEDY)[0])
    theirs = bytes(ref["greedy"].tolist())
    same = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), len(theirs))
    print(f"greedy {HF_GREEDY} bytes after prompt 0: HF generate (cache path) and the "
          f"replayjax engine agree on the first {same}: "
          f"{theirs.decode('utf-8', errors='replace')!r}")
    ok &= same == HF_GREEDY
    print(f"HF check {'PASSED' if ok else 'FAILED'} (worst relative logit error {worst:.2e}, "
          f"tolerance 1e-3)")
    return 0 if ok else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=OUT_DIR, help="export directory (default: the shipped one)")
    ap.add_argument("--text-dir", default=TEXT_DIR)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--sample-tokens", type=int, default=160)
    ap.add_argument("--check-hf", action="store_true",
                    help="compare the exported model with transformers (see --hf-python)")
    ap.add_argument("--hf-python", default="/tmp/hfvenv/bin/python",
                    help="python of a venv with torch + transformers (for --check-hf)")
    ap.add_argument("--hf-logits", nargs=2, metavar=("MODEL_DIR", "OUT_NPZ"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.hf_logits:
        hf_logits(*args.hf_logits, CHECK_PROMPTS)
        return 0
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if args.check_hf:
        return check_hf(args)
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
