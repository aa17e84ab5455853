"""Nemotron-H / Nemotron-3 (`nemotron_h`): HF hub tensor names ->
`models.nemotron_h.NemotronH`.

    backbone.embeddings.weight                    -> embeddings                       copy
    backbone.norm_f.weight                        -> norm_f/weight                    copy
    lm_head.weight                                -> lm_head/kernel (unless tied)     T
    backbone.layers.N.norm.weight                 -> layers/N/norm/weight             copy
    M  mixer.{in,out}_proj.weight (+ .bias)       -> mixer/{in,out}_proj/kernel       T
       mixer.conv1d.weight (C, 1, K) / .bias      -> mixer/conv_weight (C, K) / conv_bias
       mixer.{dt_bias, A_log, D, norm.weight}     -> mixer/{dt_bias, A_log, D, norm}  copy
    *  mixer.{q,k,v,o}_proj.weight                -> mixer/{q,k,v,o}_proj/kernel      T
    -  mixer.{up,down}_proj.weight                -> mixer/{up,down}_proj/kernel      T
    E  mixer.gate.weight (E, D)                   -> mixer/gate                       copy (fp32)
       mixer.gate.e_score_correction_bias         -> mixer/correction_bias            copy (fp32)
       mixer.experts.{e}.up_proj.weight (F, d)    -> mixer/up [E, d, F]               stack_T
       mixer.experts.{e}.down_proj.weight (d, F)  -> mixer/down [E, F, d]             stack_T
         (or stacked: mixer.experts.up_proj (E, F, d) / down_proj (E, d, F), HF 5.x in-memory names)
       mixer.shared_experts.{up,down}_proj        -> mixer/shared/{up,down}_proj/kernel  T
       mixer.fc{1,2}_latent_proj (LatentMoE)      -> mixer/fc{1,2}_latent/kernel      T
    MTP (Nemotron-3 Super / Ultra; vLLM nemotron_h_mtp.py), when the checkpoint has mtp.* tensors:
    mtp.layers.0.{enorm,hnorm}.weight             -> mtp/{enorm,hnorm}/weight         copy
    mtp.layers.0.eh_proj.weight (D, 2D)           -> mtp/eh_proj/kernel               T
    mtp.layers.i.{norm, mixer.*}                  -> mtp/layers/i/...                 as the body
    mtp.layers.{last}.final_layernorm.weight      -> mtp/final_layernorm/weight       copy
"""

from __future__ import annotations

from convert.table import TableBuilder


def _block(b: TableBuilder, path: tuple, hf: str, kind: str) -> None:
    b.copy(path + ("norm", "weight"), f"{hf}.norm.weight")
    m, mp = path + ("mixer",), f"{hf}.mixer"
    if kind == "mamba":
        b.linear(m + ("in_proj",), f"{mp}.in_proj")
        b.conv(m + ("conv_weight",), f"{mp}.conv1d.weight")
        if b.has_param(m + ("conv_bias",)):
            b.copy(m + ("conv_bias",), f"{mp}.conv1d.bias")
        for attr, name in (("dt_bias", "dt_bias"), ("A_log", "A_log"), ("D", "D"),
                           ("norm", "norm.weight")):
            b.copy(m + (attr,), f"{mp}.{name}")
        b.linear(m + ("out_proj",), f"{mp}.out_proj")
    elif kind == "attention":
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            b.linear(m + (proj,), f"{mp}.{proj}")
    elif kind == "mlp":
        b.linear(m + ("up_proj",), f"{mp}.up_proj")
        b.linear(m + ("down_proj",), f"{mp}.down_proj")
    elif kind == "moe":
        b.copy(m + ("gate",), f"{mp}.gate.weight")
        b.copy(m + ("correction_bias",), f"{mp}.gate.e_score_correction_bias")
        E, din, F = b.shape(m + ("up",))
        if b.has(f"{mp}.experts.up_proj") or b.has(f"{mp}.experts.down_proj"):   # stacked
            b.fused_T(m + ("up",), f"{mp}.experts.up_proj", (E, F, din))
            b.fused_T(m + ("down",), f"{mp}.experts.down_proj", (E, din, F))
        else:
            b.stack_T(m + ("up",), [f"{mp}.experts.{e}.up_proj.weight" for e in range(E)])
            b.stack_T(m + ("down",), [f"{mp}.experts.{e}.down_proj.weight" for e in range(E)])
        if b.has_param(m + ("shared", "up_proj", "kernel")):
            b.linear(m + ("shared", "up_proj"), f"{mp}.shared_experts.up_proj")
            b.linear(m + ("shared", "down_proj"), f"{mp}.shared_experts.down_proj")
        if b.has_param(m + ("fc1_latent", "kernel")):
            b.linear(m + ("fc1_latent",), f"{mp}.fc1_latent_proj")
            b.linear(m + ("fc2_latent",), f"{mp}.fc2_latent_proj")
    else:
        raise ValueError(f"unknown Nemotron-H layer kind {kind!r}")


def build_table(cfg, b: TableBuilder, mtp: bool) -> None:
    b.copy(("embeddings",), "backbone.embeddings.weight")
    b.copy(("norm_f", "weight"), "backbone.norm_f.weight")
    if b.has_param(("lm_head", "kernel")):
        b.linear(("lm_head",), "lm_head")
    elif b.has("lm_head.weight"):
        b.skip("lm_head.weight", "tied word embeddings: the model uses the embeddings")
    for i, kind in enumerate(cfg.layer_kinds):
        _block(b, ("layers", i), f"backbone.layers.{i}", kind)
    if mtp:
        last = len(cfg.mtp_layer_kinds) - 1
        b.copy(("mtp", "enorm", "weight"), "mtp.layers.0.enorm.weight")
        b.copy(("mtp", "hnorm", "weight"), "mtp.layers.0.hnorm.weight")
        b.linear(("mtp", "eh_proj"), "mtp.layers.0.eh_proj")
        for i, kind in enumerate(cfg.mtp_layer_kinds):
            _block(b, ("mtp", "layers", i), f"mtp.layers.{i}", kind)
        b.copy(("mtp", "final_layernorm", "weight"), f"mtp.layers.{last}.final_layernorm.weight")
