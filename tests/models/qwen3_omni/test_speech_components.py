"""The talker and the code predictor against transformers, and the speech loaders on the sharded layout."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from tests.models.qwen3_omni.speech_oracle import CODEBOOK, CODEC, SPEAKERS, TALKER_VOCAB, reference
from walkserve.core.errors import ConfigError
from walkserve.layers.attention import DenseAttention
from walkserve.models.qwen3_omni.release import SPEECH_RELEASE
from walkserve.models.qwen3_omni.speech.config import SpeechConfig
from walkserve.models.qwen3_omni.speech.weights import (
    load_code_predictor,
    load_speech,
    speech_weight_bytes,
)

pytestmark = pytest.mark.parity
torch.set_num_threads(1)
GEN = torch.Generator().manual_seed(11)


RELEASE = SPEECH_RELEASE  # the release's speech config (shared/research/next_models.md 1.5-1.7)


@pytest.fixture(scope="module")
def speech():
    return load_speech(reference().path, progress=False)


def test_the_checkpoint_is_the_release_layout():
    path = reference().path
    index = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(index.values())) > 10  # sharded
    assert "talker.model.layers.0.mlp.experts.15.down_proj.weight" in index  # one tensor per expert
    assert "talker.code_predictor.lm_head.14.weight" in index and "code2wav.decoder.6.conv.weight" in index
    assert not any(name.startswith("talker.model.embed_tokens") for name in index)


def test_config_reads_both_spellings(tmp_path):
    path = reference().path
    cfg = SpeechConfig.from_file(path)
    assert cfg.talker.num_experts == 16 and cfg.talker.num_experts_per_tok == 6 and cfg.talker.norm_topk_prob
    assert cfg.talker.attention.rope.mrope_section == (6, 5, 5) and cfg.talker.attention.rope.mrope_interleaved
    assert cfg.speakers == SPEAKERS and cfg.accept_hidden_layer == 3 and cfg.num_code_groups == 16
    assert cfg.tokens.codec_eos == CODEC["eos"] and cfg.code2wav.frame_samples == 1920
    data = json.loads((path / "config.json").read_text())  # rewrite it as transformers 4.x wrote the release
    text = data["talker_config"]["text_config"]
    text["num_experts"] = text.pop("num_local_experts")
    rope = text.pop("rope_parameters")
    text["rope_theta"] = rope["rope_theta"]
    text["rope_scaling"] = {"rope_type": "default", "mrope_section": rope["mrope_section"], "interleaved": True,
                            "mrope_interleaved": True}
    data["torch_dtype"] = data.pop("dtype")
    legacy = tmp_path / "config.json"
    legacy.write_text(json.dumps(data))
    assert SpeechConfig.from_file(tmp_path) == cfg
    data["enable_audio_output"] = False
    legacy.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="cannot speak"):
        SpeechConfig.from_file(tmp_path)


def test_talker_prefill_and_cached_steps_match_transformers(speech):
    """Interleaved 3-axis positions (an image's t/h/w), top-k experts with the shared expert, the head."""
    m = reference().model
    x = torch.randn(1, 14, 32, generator=GEN)
    pos = torch.stack([torch.full((14,), 3), torch.arange(14) % 4 + 3, torch.arange(14) // 4 + 3])  # [3, 14]
    pos[:, 10:] = torch.arange(7, 11)  # then text positions after the block
    with torch.no_grad():
        want = m.talker.codec_head(m.talker.model(inputs_embeds=x, position_ids=pos[:, None]).last_hidden_state)[0]
        prefill = DenseAttention("causal", keep=True)
        head = speech.talker(None, pos[:, :10], prefill, inputs_embeds=x[0, :10])
        step = DenseAttention("causal", past=prefill.kv, keep=True)
        tail = speech.talker(None, pos[:, 10:], step, inputs_embeds=x[0, 10:])
        got = speech.talker.compute_logits(torch.cat([head, tail]))
    assert got.shape == (14, TALKER_VOCAB) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    ids = torch.tensor([CODEC["bos"], 5])
    torch.testing.assert_close(speech.talker.embed(ids), m.talker.model.codec_embedding(ids), rtol=0, atol=0)


def test_projections_match_transformers(speech):
    m = reference().model
    y = torch.randn(5, 64, generator=GEN)
    with torch.no_grad():
        torch.testing.assert_close(speech.talker.project_text(y), m.talker.text_projection(y), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(speech.talker.project_hidden(y), m.talker.hidden_projection(y), rtol=1e-5,
                                   atol=1e-6)
        tts = torch.tensor([m.config.tts_bos_token_id, m.config.tts_eos_token_id, m.config.tts_pad_token_id])
        want = m.talker.text_projection(m.thinker.get_input_embeddings()(tts))
    got = torch.stack([speech.specials.bos, speech.specials.eos, speech.specials.pad])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_code_predictor_matches_transformers(speech):
    """Stacked groups: the embedding of stacked id (g-1)*2048 + c is E[g-1](c), the head block g is lm_head[g]."""
    cp = reference().model.talker.code_predictor
    x = torch.randn(1, 16, 32, generator=GEN)
    with torch.no_grad():
        want = cp.model(inputs_embeds=x).last_hidden_state[0]  # [16, D]
        got = speech.predictor(None, torch.arange(16), DenseAttention("causal"), inputs_embeds=x[0])
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        logits = speech.predictor.compute_logits(got)  # [16, 15 * 128]
        for g in (0, 7, 14):
            torch.testing.assert_close(logits[:, g * CODEBOOK : (g + 1) * CODEBOOK], cp.lm_head[g](want),
                                       rtol=1e-4, atol=1e-5)
        codes = torch.tensor([0, 5, CODEBOOK - 1])
        for group in (1, 9, 15):
            torch.testing.assert_close(speech.predictor.embed(speech.predictor.stacked_id(group, codes)),
                                       cp.model.codec_embedding[group - 1](codes), rtol=0, atol=0)


def test_loaders_name_what_is_wrong(tmp_path):
    path = reference().path
    for f in path.iterdir():
        shutil.copy(f, tmp_path / f.name)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    del index["weight_map"]["talker.code_predictor.lm_head.3.weight"]
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ConfigError, match="lm_head.3.weight"):
        load_code_predictor(tmp_path, progress=False)


def test_weight_bytes_per_component():
    sizes = speech_weight_bytes(reference().path)
    m = reference().model
    count = {k: sum(p.numel() for p in mod.parameters()) for k, mod in
             [("code_predictor", m.talker.code_predictor), ("code2wav", m.code2wav)]}
    talker = sum(p.numel() for p in m.talker.parameters()) - count["code_predictor"]
    assert sizes == {"talker": 4 * talker, "code_predictor": 4 * count["code_predictor"],
                     "code2wav": 4 * count["code2wav"]}
    assert speech_weight_bytes(reference().path, "bfloat16")["talker"] == 2 * talker


def test_release_config_builds_the_release_shapes():
    """Shapes of the real checkpoint (next_models.md 1.5-1.7), from our modules on the meta device."""
    from walkserve.models.qwen3_omni.speech.code2wav import Code2Wav
    from walkserve.models.qwen3_omni.speech.code_predictor import CodePredictor
    from walkserve.models.qwen3_omni.speech.talker import Talker

    cfg = SpeechConfig.from_hf(RELEASE)
    assert cfg.dtype == "bfloat16" and cfg.code2wav.frame_samples == 1920
    with torch.device("meta"):
        talker, predictor, vocoder = Talker(cfg.talker), CodePredictor(cfg.code_predictor), Code2Wav(cfg.code2wav)
    layer = talker.model.layers[0]
    assert tuple(talker.model.codec_embedding.weight.shape) == (3072, 1024)
    assert tuple(layer.self_attn.qkv_proj.weight.shape) == (2048 + 256 + 256, 1024)
    assert tuple(layer.mlp.gate.weight.shape) == (128, 1024) and layer.mlp.top_k == 6
    assert tuple(talker.text_projection.linear_fc1.weight.shape) == (2048, 2048)
    assert tuple(talker.text_projection.linear_fc2.weight.shape) == (1024, 2048)
    assert tuple(predictor.model.embed_tokens.weight.shape) == (15 * 2048, 1024) == tuple(predictor.lm_head.weight.shape)
    assert tuple(predictor.model.layers[0].self_attn.qkv_proj.weight.shape) == (2048 + 1024 + 1024, 1024)
    assert tuple(vocoder.code_embedding.weight.shape) == (16 * 2048, 1024)
    assert vocoder.config.attention.head_dim == 64
    channels = [b.block[1].conv.weight.shape[1] for b in vocoder.decoder[1:5]]
    assert channels == [768, 384, 192, 96] and vocoder.decoder[-1].conv.weight.shape[1] == 96
    counts = [sum(p.numel() for p in m.parameters()) for m in (talker, predictor, vocoder)]
    assert counts == [3_183_026_176, 141_570_304, 216_016_577]  # 6.4 / 0.28 GB bf16, 0.86 GB float32
