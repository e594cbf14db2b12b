"""The transformers reference of Qwen3-Omni's speech path on a tiny random checkpoint (tests only).

``reference()`` builds ``Qwen3OmniMoeForConditionalGeneration`` from a tiny
config that keeps every structural ratio of the release (q wider than hidden,
GQA, 16 code groups, 1920 samples per frame, interleaved 3-axis rope, top-k
renormalised experts with a shared expert), perturbs its weights so that
every norm, bias, LayerScale, ConvNeXt gamma and SnakeBeta parameter is
numerically visible (transformers' init leaves Code2Wav at ~5e-7), writes it
with ``save_pretrained`` in shards (the release's layout: index + shards,
one tensor per expert) and keeps the live model as the oracle. Built once
per process (``functools.cache``); transformers is imported here only.

Token ids follow the release's order shifted down (tiny id = 300 + release id
- 151643), as in ``shared/research/oracles_omni_vjepa.md`` §1.2.
"""

from __future__ import annotations

import atexit
import functools
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
         "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
         "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
         "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>",
         "</tool_response>", "<think>", "</think>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>",
         "<tts_text_bos>", "<tts_text_eod>", "<tts_text_bos_single>", "<|audio_pad|>"]
TOK = {t: 300 + i for i, t in enumerate(ADDED)}
IM_START, IM_END, NL = TOK["<|im_start|>"], TOK["<|im_end|>"], 10
SYSTEM, USER, ASSISTANT = 297, 298, 299
AUDIO_START, AUDIO_END, AUDIO_PAD = TOK["<|audio_start|>"], TOK["<|audio_end|>"], TOK["<|audio_pad|>"]
VISION_START, VISION_END, IMAGE_PAD = TOK["<|vision_start|>"], TOK["<|vision_end|>"], TOK["<|image_pad|>"]
VIDEO_PAD = TOK["<|video_pad|>"]
CODEBOOK = 128  # real 2048
TALKER_VOCAB = CODEBOOK + 1024  # real 3072: generate() suppresses [vocab - 1024, vocab) except codec EOS
CODEC = dict(pad=CODEBOOK + 100, bos=CODEBOOK + 101, eos=CODEBOOK + 102, nothink=CODEBOOK + 107,
             think_bos=CODEBOOK + 108, think_eos=CODEBOOK + 109)
SPEAKERS = {"chelsie": CODEBOOK + 253, "ethan": CODEBOOK + 254, "aiden": CODEBOOK + 255}
GROUPS = 16
ACCEPT = 3  # > len(deepstack_visual_indexes): transformers records hidden_states[k] before the deepstack add
C2W_WINDOW = 8  # real 72; 2 layers x 7 + 10 conv frames = 24 <= 25: LeftContext(25, 25) is exact here
TEXT_GAIN = 8.0  # so that what the talker hears of the text visibly steers its codes
SHARD_SIZE = "200KB"  # several shards + model.safetensors.index.json, like the release's 15


def tiny_hf_config(attn: str = "eager"):
    from transformers import Qwen3OmniMoeConfig

    rope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [6, 5, 5], "interleaved": True}
    thinker = dict(
        text_config=dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, moe_intermediate_size=32,
                         num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                         mlp_only_layers=[], rms_norm_eps=1e-6, max_position_embeddings=4096,
                         rope_parameters=dict(rope), tie_word_embeddings=False),
        audio_config=dict(num_mel_bins=128, d_model=32, encoder_layers=2, encoder_attention_heads=4,
                          encoder_ffn_dim=64, downsample_hidden_size=16, output_dim=64, n_window=50,
                          n_window_infer=800, conv_chunksize=500, max_source_positions=1500),
        vision_config=dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=4, in_channels=3, patch_size=16,
                           spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64,
                           num_position_embeddings=2304, deepstack_visual_indexes=[0, 1],
                           hidden_act="gelu_pytorch_tanh"),
        audio_token_id=AUDIO_PAD, image_token_id=IMAGE_PAD, video_token_id=VIDEO_PAD,
        audio_start_token_id=AUDIO_START, user_token_id=USER, vision_start_token_id=VISION_START,
        position_id_per_seconds=13)
    talker = dict(
        text_config=dict(vocab_size=TALKER_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, moe_intermediate_size=16,
                         num_experts=16, num_experts_per_tok=6, norm_topk_prob=True,
                         shared_expert_intermediate_size=48, rms_norm_eps=1e-6, max_position_embeddings=4096,
                         rope_parameters=dict(rope)),
        code_predictor_config=dict(vocab_size=CODEBOOK, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                   num_code_groups=GROUPS, rms_norm_eps=1e-6, max_position_embeddings=64,
                                   rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
        num_code_groups=GROUPS, thinker_hidden_size=64, accept_hidden_layer=ACCEPT,
        codec_eos_token_id=CODEC["eos"], codec_pad_id=CODEC["pad"], codec_bos_id=CODEC["bos"],
        codec_nothink_id=CODEC["nothink"], codec_think_bos_id=CODEC["think_bos"],
        codec_think_eos_id=CODEC["think_eos"], audio_token_id=AUDIO_PAD, image_token_id=IMAGE_PAD,
        video_token_id=VIDEO_PAD, vision_start_token_id=VISION_START, audio_start_token_id=AUDIO_START,
        position_id_per_seconds=13, speaker_id=dict(SPEAKERS), spatial_merge_size=2)
    code2wav = dict(codebook_size=CODEBOOK, hidden_size=32, num_attention_heads=4, num_key_value_heads=4,
                    intermediate_size=64, num_hidden_layers=2, sliding_window=C2W_WINDOW, num_quantizers=GROUPS,
                    decoder_dim=64, upsample_rates=[8, 5, 4, 3], upsampling_ratios=[2, 2],
                    layer_scale_initial_scale=0.01, rms_norm_eps=1e-5, max_position_embeddings=8000,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    cfg = Qwen3OmniMoeConfig(
        thinker_config=thinker, talker_config=talker, code2wav_config=code2wav, enable_audio_output=True,
        im_start_token_id=IM_START, im_end_token_id=IM_END, tts_pad_token_id=TOK["<tts_pad>"],
        tts_bos_token_id=TOK["<tts_text_bos>"], tts_eos_token_id=TOK["<tts_text_eod>"], system_token_id=SYSTEM,
        user_token_id=USER, assistant_token_id=ASSISTANT)
    for sub in (cfg, cfg.thinker_config, cfg.thinker_config.text_config, cfg.thinker_config.audio_config,
                cfg.thinker_config.vision_config, cfg.talker_config, cfg.talker_config.text_config,
                cfg.talker_config.code_predictor_config, cfg.code2wav_config):
        sub._attn_implementation = attn
    return cfg


@torch.no_grad()
def perturb(model: torch.nn.Module, seed: int = 0) -> None:
    """Every parameter random at a scale where it matters (fan-in scaled weights, norms ~1, biases ~0.1)."""
    g = torch.Generator().manual_seed(seed)
    embeddings = {n + ".weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Embedding)}
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "gamma" or name.endswith("layer_scale.scale"):
            p.copy_(0.1 + 0.4 * torch.rand(p.shape, generator=g))
        elif leaf in ("alpha", "beta"):  # SnakeBeta log-parameters
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
        elif name in embeddings:
            p.copy_(torch.randn(p.shape, generator=g))
        elif p.ndim == 1:
            base = 1.0 if ("norm" in name or "ln_" in name) and leaf == "weight" else 0.0
            p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
        else:
            fan_in = p.shape[-1] if (p.ndim == 3 and "experts" in name) else p[0].numel()
            p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))


@torch.no_grad()
def calibrate_code2wav(c2w: torch.nn.Module, target_std: float = 0.3, seed: int = 0) -> None:
    """Scale the last conv so the pre-clamp waveform has std ~0.3 (else most samples sit on the +-1 clamp)."""
    codes = torch.randint(0, CODEBOOK, (1, GROUPS, 30), generator=torch.Generator().manual_seed(seed))
    seen = {}
    hook = c2w.decoder[-1].register_forward_hook(lambda mod, a, out: seen.__setitem__("y", out))
    c2w(codes)
    hook.remove()
    scale = target_std / float(seen["y"].std())
    c2w.decoder[-1].conv.weight.mul_(scale)
    c2w.decoder[-1].conv.bias.mul_(scale)


@dataclass
class Reference:
    model: object  # Qwen3OmniMoeForConditionalGeneration, float32, eager attention and experts
    path: Path  # its save_pretrained directory (sharded)


@functools.cache
def reference() -> Reference:
    from transformers import Qwen3OmniMoeForConditionalGeneration

    torch.manual_seed(0)
    model = Qwen3OmniMoeForConditionalGeneration(tiny_hf_config()).eval()
    model.set_experts_implementation("eager")
    perturb(model)
    with torch.no_grad():  # text and media parts as large as a frame's 16 code embeddings (norm ~27), not 10x less
        for projection in (model.talker.text_projection, model.talker.hidden_projection):
            projection.linear_fc2.weight.mul_(TEXT_GAIN)
            projection.linear_fc2.bias.mul_(TEXT_GAIN)
    calibrate_code2wav(model.code2wav)
    model.talker.config.audio_config = model.thinker.config.audio_config  # transformers 5.23 bug (research §1.9)
    path = Path(tempfile.mkdtemp(prefix="qwen3_omni_speech_"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    model.save_pretrained(path, max_shard_size=SHARD_SIZE)
    return Reference(model, path)


def text_prompt() -> torch.Tensor:
    """A system turn, a user turn and the assistant header: [1, 20]."""
    return torch.tensor([[IM_START, SYSTEM, NL, 65, 66, IM_END, NL, IM_START, USER, NL, 72, 101, 108, 108, 111,
                          IM_END, NL, IM_START, ASSISTANT, NL]])


def mm_inputs(seconds: float = 2.37, seed: int = 0) -> tuple[torch.Tensor, dict]:
    """A prompt with a system turn, one audio clip and one image in the user turn, and its thinker inputs."""
    import numpy as np
    from transformers import WhisperFeatureExtractor

    fe = WhisperFeatureExtractor(feature_size=128, sampling_rate=16000, hop_length=160, n_fft=400)
    wav = (0.1 * np.random.default_rng(seed).standard_normal(int(16000 * seconds))).astype(np.float32)
    feats = fe([wav], sampling_rate=16000, padding=True, truncation=False, return_attention_mask=True,
               return_tensors="pt")
    n_frames = int(feats["attention_mask"].sum())
    rest = n_frames % 100
    tail = ((((rest - 1) // 2 + 1) - 1) // 2 + 1 - 1) // 2 + 1 if rest else 0
    n_audio = n_frames // 100 * 13 + tail  # audio encoder tokens: 13 per 100 frames + the tail's
    g = torch.Generator().manual_seed(seed)
    h, w, patch, merge = 64, 96, 16, 2
    img = torch.rand(3, h, w, generator=g) * 2 - 1
    gh, gw = h // patch, w // patch
    x = img.reshape(3, gh // merge, merge, patch, gw // merge, merge, patch).permute(1, 4, 2, 5, 0, 3, 6)
    x = x.unsqueeze(5).expand(*x.shape[:5], 2, patch, patch)  # a still image: the same frame twice
    pixels = x.reshape(gh * gw, 3 * 2 * patch * patch).contiguous()
    thw = torch.tensor([[1, gh, gw]])
    ids = torch.tensor([[IM_START, SYSTEM, NL, 65, IM_END, NL, IM_START, USER, NL, AUDIO_START]
                        + [AUDIO_PAD] * n_audio + [AUDIO_END, VISION_START] + [IMAGE_PAD] * (gh * gw // 4)
                        + [VISION_END, 104, 105, IM_END, NL, IM_START, ASSISTANT, NL]])
    extra = dict(input_features=feats["input_features"], feature_attention_mask=feats["attention_mask"],
                 pixel_values=pixels, image_grid_thw=thw)
    return ids, extra


@dataclass
class ThinkerRun:
    """The reference thinker's greedy answer and the states the talker reads."""

    prompt: torch.Tensor  # [L]
    generated: list[int]
    embeds: torch.Tensor  # [L + n - 1, Dt] input embeddings (prompt + every generated token but the last)
    accept_input: torch.Tensor  # [L, Dt] input of thinker layer ACCEPT (forward pre-hook)
    accept_output: torch.Tensor  # [L, Dt] output of thinker layer ACCEPT (forward hook): what M* takes
    hidden_states_accept: torch.Tensor  # [L, Dt] transformers' hidden_states[ACCEPT]


@torch.no_grad()
def run_thinker(ids: torch.Tensor, extra: dict, max_new: int) -> ThinkerRun:
    m = reference().model
    layer = m.thinker.model.language_model.layers[ACCEPT]
    seen: dict[str, torch.Tensor] = {}

    def before(mod, args, kwargs):  # the first call is the prefill: the prompt's rows
        seen.setdefault("in", args[0] if args else kwargs["hidden_states"])

    def after(mod, args, out):
        seen.setdefault("out", out[0] if isinstance(out, tuple) else out)

    hooks = [layer.register_forward_pre_hook(before, with_kwargs=True), layer.register_forward_hook(after)]
    try:
        out = m.thinker.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                                 eos_token_id=IM_END, do_sample=False, output_hidden_states=True,
                                 return_dict_in_generate=True, **extra)
    finally:
        for h in hooks:
            h.remove()
    length = ids.shape[1]
    generated = out.sequences[0, length:].tolist()
    embeds = torch.cat([h[0] for h in out.hidden_states], 1)[0]
    return ThinkerRun(ids[0], generated, embeds, seen["in"][0, :length], seen["out"][0, :length],
                      out.hidden_states[0][ACCEPT][0])


@torch.no_grad()
def generate_codes(ids: torch.Tensor, extra: dict, max_new: int, talker_max_new: int, eos: int = IM_END,
                   speaker: str = "Ethan"):
    """transformers' greedy ``generate(return_audio=True)``: (thinker ids [n], codes [F, 16], waveform [S])."""
    m = reference().model
    seen = {}
    original = m.code2wav.chunked_decode

    def spy(codes, **kwargs):
        seen["codes"] = codes.clone()
        return original(codes, **kwargs)

    m.code2wav.chunked_decode = spy
    try:
        seq, wav = m.generate(ids, attention_mask=torch.ones_like(ids), speaker=speaker, return_audio=True,
                              thinker_max_new_tokens=max_new, thinker_eos_token_id=eos, thinker_do_sample=False,
                              talker_max_new_tokens=talker_max_new, talker_do_sample=False,
                              talker_repetition_penalty=1.0, **extra)
    finally:
        m.code2wav.chunked_decode = original
    return seq[0, ids.shape[1]:].tolist(), seen["codes"][0].T.contiguous(), wav.reshape(-1)


def talker_positions(ids: torch.Tensor, extra: dict) -> torch.Tensor:
    """transformers' talker prefill positions [3, U + 9] for a prompt with media (get_rope_index)."""
    from walkserve.models.qwen3_omni.speech.config import SpeechConfig
    from walkserve.models.qwen3_omni.speech.talker_inputs import talker_prompt_ids

    m = reference().model
    tokens = SpeechConfig.from_file(reference().path).tokens
    t_ids = torch.tensor([talker_prompt_ids(ids[0].tolist(), tokens)])
    fam = extra.get("feature_attention_mask")
    pos, _ = m.talker.get_rope_index(t_ids, extra.get("image_grid_thw"), extra.get("video_grid_thw"),
                                     torch.ones_like(t_ids), False, None if fam is None else fam.sum(-1),
                                     extra.get("video_second_per_grid"))
    return pos[:, 0].long()
