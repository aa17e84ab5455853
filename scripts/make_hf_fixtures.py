"""Build tiny Hugging Face reference fixtures for the model tests.

Regenerate (from the repository root) with exactly:

    /tmp/hfvenv/bin/python scripts/make_hf_fixtures.py

The venv lives OUTSIDE the repo and is created with:

    python3 -m venv /tmp/hfvenv
    /tmp/hfvenv/bin/pip install torch==2.13.0 transformers==5.24.0 safetensors numpy

(python3 = 3.11; torch 2.13.0+cpu; transformers 5.24.0). Runs on CPU in fp32, takes well under a
minute.

For every variant it writes ``tests/fixtures/hf/<variant>/``:
  * ``config.json`` + ``model.safetensors`` (+ ``generation_config.json``): HF ``save_pretrained``
    output, fp32, hub tensor names (``backbone.*`` for Nemotron-H, ``model.*`` for Qwen3-Next,
    ``model.language_model.*`` for Qwen3.5 / Qwen3.5-MoE, which are saved through the multimodal
    ``...ForConditionalGeneration`` wrapper with a 1-block dummy vision tower under
    ``model.visual.*``).
  * ``reference.npz`` (see tests/fixtures/hf/README.md for the exact array semantics).

All references are computed from the model re-loaded with
``AutoModelForCausalLM.from_pretrained(<fixture dir>)``, i.e. from exactly the bytes on disk.
Output is byte-for-byte deterministic (fixed seeds, one torch thread, deterministic zip writer for
the npz).
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import sys
import zipfile
import zlib

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from transformers import (
    AutoModelForCausalLM,
    NemotronHConfig,
    NemotronHForCausalLM,
    Qwen3_5Config,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeConfig,
    Qwen3_5MoeForConditionalGeneration,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)
from transformers.utils import logging as hf_logging

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_ROOT = os.path.join(REPO, "tests", "fixtures", "hf")

VOCAB = 128
PAD, BOS, EOS = 0, 1, 2
PROMPT_LENS = (5, 11, 17)
N_FORCED = 8
N_GREEDY = 40
TOL = 1e-4  # cached (generate / teacher-forced) vs full-forward logits
# Seed acceptance: seeds are tried in order crc32(name)+0, +1, ... until these hold, so that the
# references are not sitting on a near-tie that a slightly different (but correct) implementation
# would resolve differently.
# min top1-top2 logit gap over all greedy steps
GREEDY_GAP_MIN = float(os.environ.get("GREEDY_GAP_MIN", 1e-3))
# min k-th vs (k+1)-th router selection score gap
ROUTE_MARGIN_MIN = float(os.environ.get("ROUTE_MARGIN_MIN", 1e-3))
MAX_ATTEMPTS = 64

assert transformers.__version__ == "5.24.0", transformers.__version__
assert torch.__version__.startswith("2.13.0"), torch.__version__

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
torch.set_default_dtype(torch.float32)
hf_logging.set_verbosity_error()
hf_logging.disable_progress_bar()


# --------------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------------

def _nemotron_common(**over):
    cfg = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
        tie_word_embeddings=False,
        use_cache=True,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        intermediate_size=64,  # dense '-' layer (relu2)
        mamba_num_heads=4,
        mamba_head_dim=16,
        ssm_state_size=16,
        n_groups=4,  # every head count divides 4: tensor-parallel tests at tp = 2 and 4
        conv_kernel=4,
        use_conv_bias=True,
        mamba_proj_bias=False,
        use_bias=False,
        layer_norm_epsilon=1e-5,
    )
    cfg.update(over)
    return cfg


def _moe_fields(**over):
    d = dict(
        n_routed_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        n_shared_experts=1,
        moe_shared_expert_intermediate_size=48,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        n_group=1,
        topk_group=1,
    )
    d.update(over)
    return d


def _qwen_text_common(**over):
    cfg = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,  # head counts divide 4 (tensor-parallel tests); 1 kv head replicated
        num_key_value_heads=1,
        head_dim=32,
        linear_num_key_heads=4,
        linear_num_value_heads=8,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        rms_norm_eps=1e-6,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        use_cache=True,
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
        hidden_act="silu",
    )
    cfg.update(over)
    return cfg


# Tiny dummy vision tower for the Qwen3.5 multimodal wrappers (ignored by the text model).
_TINY_VISION = dict(
    depth=1,
    hidden_size=16,
    intermediate_size=32,
    num_heads=2,
    out_hidden_size=32,
    patch_size=2,
    temporal_patch_size=1,
    spatial_merge_size=1,
    num_position_embeddings=4,
)


def build_nemotron_h():
    cfg = NemotronHConfig(
        **_nemotron_common(
            hybrid_override_pattern="M*M-ME",
            # MTP fields: HF keeps them in config.json but builds/saves no mtp.* module.
            num_nextn_predict_layers=1,
            mtp_hybrid_override_pattern="*E",
            **_moe_fields(),
        )
    )
    return cfg, NemotronHForCausalLM(cfg), "NemotronHForCausalLM"


def build_nemotron_h_latent_moe():
    cfg = NemotronHConfig(
        **_nemotron_common(
            hybrid_override_pattern="ME*EM-",
            moe_latent_size=16,
            **_moe_fields(),
        )
    )
    return cfg, NemotronHForCausalLM(cfg), "NemotronHForCausalLM"


def build_nemotron_h_p80():
    # Mamba head dim 20 (non power of two), mirroring the P=80 of Nemotron-Nano-9B-v2
    # (128 heads x 80).
    cfg = NemotronHConfig(
        **_nemotron_common(
            hybrid_override_pattern="M-M*M-",
            mamba_num_heads=8,  # 2 heads per group, group size I/G = 40 as before
            mamba_head_dim=20,
        )
    )
    return cfg, NemotronHForCausalLM(cfg), "NemotronHForCausalLM"


def build_qwen3_next():
    cfg = Qwen3NextConfig(
        **_qwen_text_common(
            full_attention_interval=4,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                             "partial_rotary_factor": 0.25},
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            intermediate_size=64,
        )
    )
    return cfg, Qwen3NextForCausalLM(cfg), "Qwen3NextForCausalLM"


_QWEN35_ROPE = {
    "rope_type": "default",
    "rope_theta": 10000.0,
    "partial_rotary_factor": 0.25,  # rotary dim 8 of head_dim 32
    "mrope_section": [2, 1, 1],  # sums to rotary_dim/2 (real 35B/9B: [11, 11, 10] for 64)
    "mrope_interleaved": True,
}


# Hub Qwen3.5 text configs carry these; HF 5.24 ignores them (always gated attention, fp32 GDN
# state) but keeps them in config.json, so they exercise our config parser.
_QWEN35_EXTRA = dict(attn_output_gate=True, mamba_ssm_dtype="float32")


def build_qwen3_5():
    text = _qwen_text_common(
        full_attention_interval=4, rope_parameters=dict(_QWEN35_ROPE), intermediate_size=64,
        **_QWEN35_EXTRA
    )
    cfg = Qwen3_5Config(text_config=text, vision_config=dict(_TINY_VISION),
                        tie_word_embeddings=False)
    return cfg, Qwen3_5ForConditionalGeneration(cfg), "Qwen3_5ForConditionalGeneration"


def build_qwen3_5_moe():
    text = _qwen_text_common(
        full_attention_interval=4,
        rope_parameters=dict(_QWEN35_ROPE),
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        **_QWEN35_EXTRA,
    )
    cfg = Qwen3_5MoeConfig(text_config=text, vision_config=dict(_TINY_VISION),
                           tie_word_embeddings=False)
    return cfg, Qwen3_5MoeForConditionalGeneration(cfg), "Qwen3_5MoeForConditionalGeneration"


VARIANTS = {
    "nemotron_h": build_nemotron_h,
    "nemotron_h_latent_moe": build_nemotron_h_latent_moe,
    "nemotron_h_p80": build_nemotron_h_p80,
    "qwen3_next": build_qwen3_next,
    "qwen3_5": build_qwen3_5,
    "qwen3_5_moe": build_qwen3_5_moe,
}


# --------------------------------------------------------------------------------------------------
# Random re-initialisation (the HF default init gives near-degenerate logits and constant
# A_log / D / norms)
# --------------------------------------------------------------------------------------------------

@torch.no_grad()
def reinit_(model, seed: int, is_nemotron: bool):
    g = torch.Generator().manual_seed(seed)

    def normal(shape, std, mean=0.0):
        return torch.randn(shape, generator=g) * std + mean

    def uniform(shape, lo, hi):
        return torch.rand(shape, generator=g) * (hi - lo) + lo

    tensors = list(model.named_parameters()) + [
        (n, b) for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")
    ]
    for name, p in sorted(tensors, key=lambda kv: kv[0]):
        if ".visual." in name or name.startswith("visual.") or name.startswith("model.visual."):
            continue  # dummy vision tower: keep HF init
        leaf = name.split(".")[-1]
        shape = p.shape
        if leaf == "A_log":
            # Mamba: A in [0.5, 8]; GDN: A in [0.1, 1.5] (weaker decay keeps the state, and hence
            # the per-head RMSNorm input, well away from zero; strong decay made the fp32
            # reference ill-conditioned).
            new = torch.log(uniform(shape, 0.5, 8.0) if is_nemotron else uniform(shape, 0.1, 1.5))
        elif leaf == "dt_bias":
            if is_nemotron:
                # Delta = softplus(dt + dt_bias); keep base Delta in [0.03, 0.3] (and the dt rows
                # of in_proj small, below) so that HF's prefill-only clamp
                # (Delta >= time_step_min = 1e-3) never triggers (asserted).
                dt = torch.exp(uniform(shape, math.log(0.03), math.log(0.3)))
                new = dt + torch.log(-torch.expm1(-dt))
            else:
                new = uniform(shape, -1.0, 1.0)
        elif leaf == "D":
            new = uniform(shape, 0.5, 1.5)
        elif leaf == "e_score_correction_bias":
            new = normal(shape, 0.05)
        elif "conv1d" in name and leaf == "weight":
            new = uniform(shape, -0.5, 0.5)
        elif "conv1d" in name and leaf == "bias":
            new = uniform(shape, -0.2, 0.2)
        elif p.ndim == 1 and "norm" in name:
            # keep HF centring (zeros for Qwen (1+w) norms, ones for plain norms) and perturb.
            new = p.detach().clone() + normal(shape, 0.1)
        elif p.ndim == 1:
            new = normal(shape, 0.1)
        elif "embed" in name:
            new = normal(shape, 1.0)
        elif name.startswith("lm_head"):
            new = normal(shape, 1.0 / math.sqrt(shape[-1]))
        else:  # Linear (out, in) and stacked expert (E, out, in) weights
            new = normal(shape, 1.0 / math.sqrt(shape[-1]))
            if is_nemotron and name.endswith("mixer.in_proj.weight"):
                H = model.config.mamba_num_heads
                new[-H:] *= 0.5  # dt rows
        p.copy_(new.to(p.dtype))


# --------------------------------------------------------------------------------------------------
# Instrumentation: Mamba Delta minimum (HF clamp check) and MoE top-k margins
# --------------------------------------------------------------------------------------------------

class Probe:
    def __init__(self, model):
        self.min_delta = math.inf
        self.min_route_margin = math.inf
        self.handles = []
        for _name, mod in model.named_modules():
            cls = type(mod).__name__
            if cls == "NemotronHMamba2Mixer":
                self.handles.append(mod.in_proj.register_forward_hook(self._mamba_hook(mod)))
            elif cls.endswith("TopkRouter") or cls.endswith("TopKRouter"):
                self.handles.append(mod.register_forward_hook(self._router_hook(mod, cls)))

    def _mamba_hook(self, mixer):
        def hook(_m, _inp, out):
            H = mixer.num_heads
            dt = out[..., -H:].float() + mixer.dt_bias.float()
            self.min_delta = min(self.min_delta, F.softplus(dt).min().item())

        return hook

    def _router_hook(self, mod, cls):
        def hook(_m, inp, _out):
            x = inp[0].reshape(-1, mod.weight.shape[-1]).float()
            logits = x @ mod.weight.float().t()
            if cls.startswith("NemotronH"):  # selection on sigmoid(logits) + correction bias
                score = logits.sigmoid() + mod.e_score_correction_bias.float()
            else:  # softmax top-k == logits top-k; margin measured in logit (= log-prob) units
                score = logits
            s = score.sort(-1, descending=True).values
            k = mod.top_k
            self.min_route_margin = min(self.min_route_margin, (s[:, k - 1] - s[:, k]).min().item())

        return hook

    def close(self):
        for h in self.handles:
            h.remove()


# --------------------------------------------------------------------------------------------------
# Reference computation
# --------------------------------------------------------------------------------------------------

@torch.no_grad()
def full_logits(model, ids):
    out = model(input_ids=torch.tensor([list(ids)], dtype=torch.long), use_cache=False)
    return out.logits[0].float().numpy()


@torch.no_grad()
def cached_teacher_forced(model, prompt, forced):
    """Prefill the prompt with a cache, then decode each forced token one at a time (HF cache
    path)."""
    ids = torch.tensor([list(prompt)], dtype=torch.long)
    out = model(input_ids=ids, use_cache=True)
    cache = out.cache
    res = []
    for i, t in enumerate(forced):
        pos = torch.tensor([[len(prompt) + i]], dtype=torch.long)
        out = model(input_ids=torch.tensor([[int(t)]]), cache=cache, position_ids=pos,
                    use_cache=True)
        cache = out.cache
        res.append(out.logits[0, -1].float().numpy())
    return np.stack(res)


@torch.no_grad()
def greedy(model, prompt):
    ids = torch.tensor([list(prompt)], dtype=torch.long)
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=N_GREEDY,
        min_new_tokens=0,
        use_cache=True,
        output_logits=True,
        return_dict_in_generate=True,
        eos_token_id=None,
        pad_token_id=PAD,
    )
    toks = out.sequences[0, len(prompt):].numpy().astype(np.int32)
    logits = torch.stack([lg[0] for lg in out.logits]).float().numpy()
    assert toks.shape == (N_GREEDY,), toks.shape
    assert logits.shape == (N_GREEDY, VOCAB), logits.shape
    return toks, logits


def write_npz_deterministic(path, arrays: dict):
    """Like np.savez but with fixed zip timestamps so the bytes are reproducible."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        for key in sorted(arrays):
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(arrays[key]), allow_pickle=False)
            info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue())


def safetensors_keys(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return {k: (v["dtype"], tuple(v["shape"])) for k, v in header.items()}


def make_variant(name, builder, attempt):
    """Build one variant with seed crc32(name) + attempt. Returns (accepted, problems,
    dir_bytes)."""
    seed = (zlib.crc32(name.encode()) + attempt) & 0x7FFFFFFF
    torch.manual_seed(seed)
    np.random.seed(seed % (2**32))
    cfg, model, saved_cls = builder()
    is_nemotron = name.startswith("nemotron")
    reinit_(model, seed, is_nemotron)
    model.eval()

    out_dir = os.path.join(OUT_ROOT, name)
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    for f in os.listdir(out_dir):
        os.chmod(os.path.join(out_dir, f), 0o644)  # safetensors writes 0600

    # Reload what is on disk, through the CausalLM auto class (Qwen3.5 wrappers -> text-only
    # ...ForCausalLM).
    ref = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32)
    ref.eval()

    rng = np.random.RandomState(seed)
    n_p = len(PROMPT_LENS)
    max_len = max(PROMPT_LENS)
    prompts = np.zeros((n_p, max_len), np.int32)  # padded with PAD (=0) past prompt_lens
    prompt_lens = np.array(PROMPT_LENS, np.int32)
    for i, L in enumerate(PROMPT_LENS):
        prompts[i, :L] = rng.randint(3, VOCAB, size=L)
    forced_tokens = rng.randint(3, VOCAB, size=(n_p, N_FORCED)).astype(np.int32)

    # Sanity: the in-memory model and the reloaded one agree.
    with torch.no_grad():
        ids = torch.tensor([list(prompts[-1, : prompt_lens[-1]])], dtype=torch.long)
        a = model(input_ids=ids, use_cache=False).logits[0].float().numpy()
    b = full_logits(ref, prompts[-1, : prompt_lens[-1]])
    reload_diff = float(np.abs(a - b).max())
    assert reload_diff == 0.0 or reload_diff < 1e-6, \
        f"{name}: reloaded model differs ({reload_diff})"

    probe = Probe(ref)
    prefill_logits = np.zeros((n_p, max_len, VOCAB), np.float32)
    forced_logits = np.zeros((n_p, N_FORCED, VOCAB), np.float32)
    greedy_tokens = np.zeros((n_p, N_GREEDY), np.int32)
    greedy_logits = np.zeros((n_p, N_GREEDY, VOCAB), np.float32)
    max_greedy_diff = 0.0
    max_forced_cache_diff = 0.0
    max_prefill_vs_gen0 = 0.0
    min_top2_gap = math.inf
    for i, L in enumerate(PROMPT_LENS):
        p = prompts[i, :L]
        prefill_logits[i, :L] = full_logits(ref, p)
        seq = np.concatenate([p, forced_tokens[i]])
        fl = full_logits(ref, seq)
        forced_logits[i] = fl[L : L + N_FORCED]
        tf = cached_teacher_forced(ref, p, forced_tokens[i])
        max_forced_cache_diff = max(max_forced_cache_diff,
                                    float(np.abs(tf - forced_logits[i]).max()))

        toks, glog = greedy(ref, p)
        greedy_tokens[i] = toks
        greedy_logits[i] = glog
        assert np.array_equal(glog.argmax(-1).astype(np.int32), toks), \
            f"{name}: greedy tokens != argmax"
        # cached generate logits vs. a single full forward over prompt + greedy tokens
        full = full_logits(ref, np.concatenate([p, toks[:-1]]))[L - 1 : L - 1 + N_GREEDY]
        max_greedy_diff = max(max_greedy_diff, float(np.abs(full - glog).max()))
        max_prefill_vs_gen0 = max(max_prefill_vs_gen0,
                                  float(np.abs(prefill_logits[i, L - 1] - glog[0]).max()))
        s = np.sort(glog, axis=-1)
        min_top2_gap = min(min_top2_gap, float((s[:, -1] - s[:, -2]).min()))
    probe.close()

    problems = []
    if is_nemotron and not probe.min_delta > ref.config.time_step_min:
        problems.append(f"HF prefill dt clamp would trigger (min Delta {probe.min_delta:.2e})")
    if not max_greedy_diff < TOL:
        problems.append(f"cached greedy logits vs full forward diff {max_greedy_diff:.2e}")
    if not max_forced_cache_diff < TOL:
        problems.append(f"cached teacher-forced vs full forward diff {max_forced_cache_diff:.2e}")
    if not max_prefill_vs_gen0 < TOL:
        problems.append(f"prefill vs generate step-0 diff {max_prefill_vs_gen0:.2e}")
    if not all(np.isfinite(a).all() for a in (prefill_logits, forced_logits, greedy_logits)):
        problems.append("non-finite logits")
    if not min_top2_gap >= GREEDY_GAP_MIN:
        problems.append(f"greedy top1-top2 gap {min_top2_gap:.1e} < {GREEDY_GAP_MIN}")
    if not probe.min_route_margin >= ROUTE_MARGIN_MIN:
        problems.append(f"MoE top-k margin {probe.min_route_margin:.1e} < {ROUTE_MARGIN_MIN}")
    if problems:
        print(f"[{name}] seed {seed} (attempt {attempt}) rejected: {'; '.join(problems)}",
              flush=True)
        return False, problems, 0

    write_npz_deterministic(
        os.path.join(out_dir, "reference.npz"),
        dict(
            prompts=prompts,
            prompt_lens=prompt_lens,
            prefill_logits=prefill_logits,
            forced_tokens=forced_tokens,
            forced_logits=forced_logits,
            greedy_tokens=greedy_tokens,
            greedy_logits=greedy_logits,
        ),
    )
    os.chmod(os.path.join(out_dir, "reference.npz"), 0o644)

    valid = np.concatenate([prefill_logits[i, :L] for i, L in enumerate(PROMPT_LENS)])
    keys = safetensors_keys(os.path.join(out_dir, "model.safetensors"))
    size = sum(os.path.getsize(os.path.join(out_dir, f)) for f in os.listdir(out_dir))
    print(
        f"[{name}] saved={saved_cls} loaded={type(ref).__name__} seed={seed} tensors={len(keys)} "
        f"dir_bytes={size}\n"
        f"    logits std={valid.std():.4f} mean={valid.mean():+.4f}  "
        f"reload_diff={reload_diff:.2e}\n"
        f"    max|cached greedy - full fwd|={max_greedy_diff:.3e}  "
        f"max|cached teacher-forced - full fwd|={max_forced_cache_diff:.3e}  "
        f"max|prefill[L-1] - greedy[0]|={max_prefill_vs_gen0:.3e}\n"
        f"    min greedy top1-top2 gap={min_top2_gap:.4f}"
        + (f"  min MoE top-k margin={probe.min_route_margin:.2e}"
           if math.isfinite(probe.min_route_margin) else "")
        + (f"  min Mamba Delta={probe.min_delta:.3e}" if math.isfinite(probe.min_delta) else ""),
        flush=True,
    )
    return True, [], size


def main(argv):
    names = argv[1:] or list(VARIANTS)
    os.makedirs(OUT_ROOT, exist_ok=True)
    total = 0
    for n in names:
        for attempt in range(MAX_ATTEMPTS):
            ok, problems, size = make_variant(n, VARIANTS[n], attempt)
            if ok:
                break
        else:
            raise SystemExit(f"{n}: no acceptable seed in {MAX_ATTEMPTS} attempts; "
                             f"last problems: {problems}")
        total += size
    print(f"total fixture bytes (model dirs): {total}")


if __name__ == "__main__":
    main(sys.argv)
