"""Tensor names and shapes of the talker and Code2Wav sections, from their config sections (torch-free).

The names are those the release and transformers' ``save_pretrained`` write
(``talker.*``, ``code2wav.*``; MoE experts one tensor set per expert), so a
tiny checkpoint has the real layout before those modules exist here. The
thinker's names come from its modules (``walkserve.models.qwen3_omni.thinker.weights``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Shapes = dict[str, tuple[int, ...]]


def talker_tensor_shapes(talker: Mapping[str, Any]) -> Shapes:
    """``talker.*``: the MoE talker, its two input projections, codec head and the code predictor."""
    text, cp = talker["text_config"], talker["code_predictor_config"]
    d, thinker_d = text["hidden_size"], talker["thinker_hidden_size"]
    out: Shapes = {
        "talker.model.codec_embedding.weight": (text["vocab_size"], d),
        "talker.model.norm.weight": (d,),
        "talker.codec_head.weight": (text["vocab_size"], d),
    }
    inter = text["intermediate_size"]  # the projections' hidden width (transformers' ResizeMLP)
    for proj in ("text_projection", "hidden_projection"):
        out[f"talker.{proj}.linear_fc1.weight"] = (inter, thinker_d)
        out[f"talker.{proj}.linear_fc1.bias"] = (inter,)
        out[f"talker.{proj}.linear_fc2.weight"] = (d, inter)
        out[f"talker.{proj}.linear_fc2.bias"] = (d,)
    experts = text.get("num_experts", text.get("num_local_experts"))
    moe, shared = text["moe_intermediate_size"], text.get("shared_expert_intermediate_size", 0)
    for i in range(text["num_hidden_layers"]):
        p = f"talker.model.layers.{i}"
        out.update(_attention(p, text))
        out[f"{p}.mlp.gate.weight"] = (experts, d)
        for e in range(experts):
            out.update(_swiglu(f"{p}.mlp.experts.{e}", d, moe))
        if shared:
            out.update(_swiglu(f"{p}.mlp.shared_expert", d, shared))
            out[f"{p}.mlp.shared_expert_gate.weight"] = (1, d)
    out.update(_code_predictor(cp, talker["num_code_groups"]))
    return out


def _code_predictor(cp: Mapping[str, Any], groups: int) -> Shapes:
    d = cp["hidden_size"]
    out: Shapes = {"talker.code_predictor.model.norm.weight": (d,)}
    for g in range(groups - 1):
        out[f"talker.code_predictor.model.codec_embedding.{g}.weight"] = (cp["vocab_size"], d)
        out[f"talker.code_predictor.lm_head.{g}.weight"] = (cp["vocab_size"], d)
    for i in range(cp["num_hidden_layers"]):
        p = f"talker.code_predictor.model.layers.{i}"
        out.update(_attention(p, cp))
        out.update(_swiglu(f"{p}.mlp", d, cp["intermediate_size"]))
    return out


def _attention(p: str, c: Mapping[str, Any]) -> Shapes:
    """A decoder layer's attention (q/k RMSNorm, no biases) and its two norms."""
    d, heads = c["hidden_size"], c["num_attention_heads"]
    kv, hd = c.get("num_key_value_heads") or heads, c.get("head_dim") or c["hidden_size"] // heads
    return {
        f"{p}.input_layernorm.weight": (d,),
        f"{p}.post_attention_layernorm.weight": (d,),
        f"{p}.self_attn.q_proj.weight": (heads * hd, d),
        f"{p}.self_attn.k_proj.weight": (kv * hd, d),
        f"{p}.self_attn.v_proj.weight": (kv * hd, d),
        f"{p}.self_attn.o_proj.weight": (d, heads * hd),
        f"{p}.self_attn.q_norm.weight": (hd,),
        f"{p}.self_attn.k_norm.weight": (hd,),
    }


def _swiglu(p: str, d: int, inner: int) -> Shapes:
    return {f"{p}.gate_proj.weight": (inner, d), f"{p}.up_proj.weight": (inner, d), f"{p}.down_proj.weight": (d, inner)}


def code2wav_tensor_shapes(c: Mapping[str, Any]) -> Shapes:
    """``code2wav.*``: code embedding, sliding-window pre-transformer, ConvNeXt upsampling, SnakeBeta decoder."""
    d, inner = c["hidden_size"], c["intermediate_size"]
    heads = c["num_attention_heads"]
    kv, hd = c.get("num_key_value_heads") or heads, c.get("head_dim") or d // heads
    out: Shapes = {"code2wav.code_embedding.weight": (c["num_quantizers"] * c["codebook_size"], d),
                   "code2wav.pre_transformer.norm.weight": (d,)}
    for i in range(c["num_hidden_layers"]):
        p = f"code2wav.pre_transformer.layers.{i}"
        out.update({
            f"{p}.input_layernorm.weight": (d,), f"{p}.post_attention_layernorm.weight": (d,),
            f"{p}.self_attn.q_proj.weight": (heads * hd, d), f"{p}.self_attn.k_proj.weight": (kv * hd, d),
            f"{p}.self_attn.v_proj.weight": (kv * hd, d), f"{p}.self_attn.o_proj.weight": (d, heads * hd),
            f"{p}.self_attn_layer_scale.scale": (d,), f"{p}.mlp_layer_scale.scale": (d,),
        })
        out.update(_swiglu(f"{p}.mlp", d, inner))
    for i, ratio in enumerate(c["upsampling_ratios"]):
        p = f"code2wav.upsample.{i}"
        out.update({f"{p}.0.conv.weight": (d, d, ratio), f"{p}.0.conv.bias": (d,),
                    f"{p}.1.dwconv.conv.weight": (d, 1, 7), f"{p}.1.dwconv.conv.bias": (d,),
                    f"{p}.1.norm.weight": (d,), f"{p}.1.norm.bias": (d,), f"{p}.1.gamma": (d,),
                    f"{p}.1.pwconv1.weight": (4 * d, d), f"{p}.1.pwconv1.bias": (4 * d,),
                    f"{p}.1.pwconv2.weight": (d, 4 * d), f"{p}.1.pwconv2.bias": (d,)})
    out.update(_decoder(c))
    return out


def _decoder(c: Mapping[str, Any]) -> Shapes:
    width = c["decoder_dim"]
    out: Shapes = {"code2wav.decoder.0.conv.weight": (width, c["hidden_size"], 7),
                   "code2wav.decoder.0.conv.bias": (width,)}
    for i, rate in enumerate(c["upsample_rates"], start=1):
        cin, cout = width // 2 ** (i - 1), width // 2**i
        p = f"code2wav.decoder.{i}.block"
        out.update({f"{p}.0.alpha": (cin,), f"{p}.0.beta": (cin,),
                    f"{p}.1.conv.weight": (cin, cout, 2 * rate), f"{p}.1.conv.bias": (cout,)})
        for unit in (2, 3, 4):  # residual units, dilations 1 / 3 / 9
            u = f"{p}.{unit}"
            out.update({f"{u}.act1.alpha": (cout,), f"{u}.act1.beta": (cout,), f"{u}.act2.alpha": (cout,),
                        f"{u}.act2.beta": (cout,), f"{u}.conv1.conv.weight": (cout, cout, 7),
                        f"{u}.conv1.conv.bias": (cout,), f"{u}.conv2.conv.weight": (cout, cout, 1),
                        f"{u}.conv2.conv.bias": (cout,)})
    last, n = width // 2 ** len(c["upsample_rates"]), len(c["upsample_rates"])
    out.update({f"code2wav.decoder.{n + 1}.alpha": (last,), f"code2wav.decoder.{n + 1}.beta": (last,),
                f"code2wav.decoder.{n + 2}.conv.weight": (1, last, 7), f"code2wav.decoder.{n + 2}.conv.bias": (1,)})
    return out
