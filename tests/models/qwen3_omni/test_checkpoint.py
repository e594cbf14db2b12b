"""Checkpoint layout: our tiny writer against transformers' save_pretrained, loading both ways, config spellings."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from tests.models.qwen3_omni.conftest import IDS, chat_ids, image_block, rgb
from walkserve.core.errors import ConfigError
from walkserve.models.common.checkpoint import SafetensorsCheckpoint
from walkserve.models.qwen3_omni.config import Qwen3OmniConfig
from walkserve.models.qwen3_omni.thinker.generate import prefill_logits
from walkserve.models.qwen3_omni.thinker.image_processor import VisionPreprocess, preprocess_image
from walkserve.models.qwen3_omni.thinker.request import thinker_request
from walkserve.models.qwen3_omni.thinker.weights import (
    estimate_weight_bytes,
    load_thinker_components,
    weight_bytes_by_component,
)
from walkserve.models.qwen3_omni.tiny import tiny_hf_config


def _layout(directory) -> dict[str, tuple[int, ...]]:
    return {name: shape for name, (shape, _) in SafetensorsCheckpoint(directory).shapes().items()}


def test_tiny_writer_has_the_save_pretrained_layout(ours_dir, hf_dir):
    """Every name and shape of all three parts (thinker, talker, Code2Wav) equals what transformers writes."""
    ours, theirs = _layout(ours_dir), _layout(hf_dir)
    assert set(ours) == set(theirs)
    assert {n: ours[n] for n in ours if ours[n] != theirs[n]} == {}
    assert {n.split(".")[0] for n in ours} == {"thinker", "talker", "code2wav"}
    assert "thinker.model.layers.0.mlp.experts.7.down_proj.weight" in ours  # one tensor set per expert
    index = json.loads((ours_dir / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(index.values())) == 15
    assert {index[n] for n in index if n.startswith("talker.")} == {"model-00014-of-00015.safetensors"}
    assert {index[n] for n in index if n.startswith("code2wav.")} == {"model-00015-of-00015.safetensors"}


@pytest.mark.parity
def test_our_checkpoint_loads_in_transformers_with_equal_logits(ours_dir):
    from transformers import Qwen3OmniMoeForConditionalGeneration

    ref, info = Qwen3OmniMoeForConditionalGeneration.from_pretrained(ours_dir, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    ours = load_thinker_components(ours_dir, progress=False)
    image = preprocess_image(rgb(64, 64), VisionPreprocess(min_pixels=32 * 32, max_pixels=128 * 128))
    request = thinker_request(chat_ids(image_block() + [104]), ours.config, images=[image])
    ids = torch.tensor([request.input_ids])
    with torch.no_grad():
        want = ref.eval().thinker(input_ids=ids, attention_mask=torch.ones_like(ids),
                                  pixel_values=torch.from_numpy(image.pixel_values),
                                  image_grid_thw=torch.tensor([image.grid_thw])).logits[0]
    torch.testing.assert_close(prefill_logits(ours, request), want, rtol=0, atol=1e-4)
    codes = torch.randint(0, 128, (1, 16, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        wave = ref.code2wav(codes)  # the tiny Code2Wav speaks: not near zero, not stuck at the clamp
    assert 0.1 < float(wave.std()) < 1.0 and float((wave.abs() > 0.999).float().mean()) < 0.05


def test_weights_are_perturbed_to_be_visible(ours_dir):
    """Not the default init: LayerScale, SnakeBeta, audio attention and biases all carry signal."""
    ckpt = SafetensorsCheckpoint(ours_dir)
    names = ["code2wav.pre_transformer.layers.0.mlp_layer_scale.scale", "code2wav.decoder.5.alpha",
             "thinker.audio_tower.layers.0.self_attn.k_proj.weight", "thinker.audio_tower.layers.0.fc1.bias"]
    t = dict(ckpt.tensors(names, progress=False))
    assert t[names[0]].min() >= 0.1 and t[names[1]].std() > 0.1
    assert t[names[2]].std() > 0.1 and t[names[3]].abs().mean() > 0.03


def test_only_thinker_shards_are_read_with_speech_off(ours_dir, tmp_path):
    """With the talker and Code2Wav shards gone, the thinker and its encoders still load."""
    copy = tmp_path / "thinker_only"
    shutil.copytree(ours_dir, copy)
    (copy / "model-00014-of-00015.safetensors").unlink()
    (copy / "model-00015-of-00015.safetensors").unlink()
    parts = load_thinker_components(copy, progress=False)
    assert parts.audio is not None and parts.vision is not None
    thinker = estimate_weight_bytes(ours_dir)
    assert estimate_weight_bytes(ours_dir, speech=True) > thinker > 0
    parts = weight_bytes_by_component(ours_dir, "bfloat16")
    lm = sum(p.numel() for p in parts_lm(ours_dir)) * 2
    assert set(parts) == {"thinker", "audio_encoder", "vision_encoder", "talker", "code2wav"}
    assert parts["thinker"] == lm and estimate_weight_bytes(ours_dir, "bfloat16") == sum(
        parts[k] for k in ("thinker", "audio_encoder", "vision_encoder"))


def parts_lm(directory):
    from walkserve.engines.spec import BuildContext
    from walkserve.models.qwen3_omni.thinker.weights import build_thinker

    return list(build_thinker(BuildContext(rank=0, device="cpu", dtype="bfloat16"), directory).parameters())


def test_both_config_spellings_parse_alike(tmp_path):
    legacy = tiny_hf_config(rope_form="legacy")
    assert "rope_scaling" in legacy["thinker_config"]["text_config"]
    assert "num_experts" in legacy["talker_config"]["text_config"] and "torch_dtype" in legacy
    a, b = Qwen3OmniConfig.from_hf(tiny_hf_config()), Qwen3OmniConfig.from_hf(legacy)
    assert (a.text, a.audio, a.vision, a.tokens, a.dtype) == (b.text, b.audio, b.vision, b.tokens, b.dtype)
    assert a.text.rope.mrope_section == (6, 5, 5) and a.text.rope.mrope_interleaved
    text = dict(tiny_hf_config()["thinker_config"]["text_config"])
    text["num_local_experts"] = text.pop("num_experts")
    config = tiny_hf_config()
    config["thinker_config"]["text_config"] = text
    assert Qwen3OmniConfig.from_hf(config).text.num_experts == 8
    with pytest.raises(ConfigError, match="not a Qwen3-Omni"):
        Qwen3OmniConfig.from_hf({"architectures": ["LlamaForCausalLM"]})


def test_swish_is_silu_and_other_activations_are_refused():
    """transformers reads hidden_act "swish" as SiLU; the thinker and the speech path accept both names."""
    from walkserve.models.qwen3_omni.speech.config import SpeechConfig

    config = tiny_hf_config()
    for where in (config["thinker_config"]["text_config"], config["talker_config"]["text_config"],
                  config["talker_config"]["code_predictor_config"]):
        where["hidden_act"] = "swish"
    assert Qwen3OmniConfig.from_hf(config).text.hidden_size == Qwen3OmniConfig.from_hf(tiny_hf_config()).text.hidden_size
    assert SpeechConfig.from_hf(config).talker == SpeechConfig.from_hf(tiny_hf_config()).talker
    config["talker_config"]["text_config"]["hidden_act"] = "gelu"
    with pytest.raises(ConfigError, match="hidden_act 'gelu'"):
        SpeechConfig.from_hf(config)


def test_a_checkpoint_without_vision(tmp_path):
    """-Captioner style: no vision_config, so no vision encoder and no thinker.visual tensors are expected."""
    from walkserve.models.qwen3_omni.thinker.weights import (
        load_vision_encoder,
        thinker_tensor_shapes,
    )

    config = tiny_hf_config(speech=False)
    del config["thinker_config"]["vision_config"]
    parsed = Qwen3OmniConfig.from_hf(config)
    assert parsed.vision is None and parsed.audio is not None and parsed.talker is None
    assert not any(n.startswith("thinker.visual.") for n in thinker_tensor_shapes(parsed))
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="no vision encoder"):
        load_vision_encoder(tmp_path)


def test_release_config_numbers():
    """The release's thinker: 48 layers, 4 KV heads x 128 -> 96 KiB of bf16 KV per token; top-8 of 128."""
    config = tiny_hf_config(rope_form="legacy", vocab_size=152064, hidden_size=2048, num_hidden_layers=48,
                            num_attention_heads=32, num_key_value_heads=4, head_dim=128, moe_intermediate_size=768,
                            num_experts=128, num_experts_per_tok=8, max_position_embeddings=65536)
    config["thinker_config"]["text_config"]["rope_scaling"]["mrope_section"] = [24, 20, 20]
    text = Qwen3OmniConfig.from_hf(config).text
    assert 2 * text.num_hidden_layers * text.kv_size * 2 == 96 * 1024
    assert (text.num_experts, text.num_experts_per_tok, text.rope.mrope_section) == (128, 8, (24, 20, 20))


def test_tiny_cli_writes_a_loadable_checkpoint(tmp_path, capsys):
    from walkserve.cli.main import main

    assert main(["tiny", "qwen3-omni", str(tmp_path / "omni")]) == 0
    assert "qwen3-omni" in capsys.readouterr().out
    config = Qwen3OmniConfig.from_file(tmp_path / "omni")
    assert config.random_weights and config.enable_audio_output and config.talker is not None
    assert config.tokens.image_token_id == IDS["image_pad"]


def test_the_speech_half_loads_from_the_tiny_checkpoint(ours_dir):
    """The talker, code predictor and Code2Wav modules read every speech tensor the tiny writer wrote."""
    from walkserve.models.qwen3_omni.speech.weights import load_speech

    speech = load_speech(ours_dir, progress=False)
    written = {n for n in _layout(ours_dir) if n.startswith(("talker.", "code2wav."))}
    loaded = sum(p.numel() for m in (speech.talker, speech.predictor, speech.code2wav) for p in m.parameters())
    assert loaded == sum(math.prod(_layout(ours_dir)[n]) for n in written)


def test_talker_layout_follows_a_wider_thinker():
    """The talker's input projections read the thinker's width into the talker's intermediate size, as
    transformers builds them (the tiny config has both 64, so only a wider thinker tells them apart)."""
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration

    from walkserve.models.qwen3_omni.tiny_layout import talker_tensor_shapes

    hf = tiny_hf_config(hidden_size=96)
    assert hf["talker_config"]["thinker_hidden_size"] == 96
    with torch.device("meta"):
        ref = Qwen3OmniMoeForConditionalGeneration(Qwen3OmniMoeConfig(**hf))
    theirs = {n: tuple(p.shape) for n, p in ref.state_dict().items() if n.startswith("talker.")}
    ours = talker_tensor_shapes(hf["talker_config"])
    projections = [n for n in ours if "_projection." in n]
    assert len(projections) == 8
    common = set(ours) & set(theirs)  # in memory transformers fuses the experts; those names differ
    assert set(projections) <= common
    assert {n: (ours[n], theirs[n]) for n in common if ours[n] != theirs[n]} == {}
