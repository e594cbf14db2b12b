"""The speech half of a Qwen3-Omni ``config.json``: talker, code predictor, Code2Wav (torch-free).

Where the fields live in the release's config (``Qwen/Qwen3-Omni-30B-A3B-Instruct``)::

    {"enable_audio_output": true, "im_start_token_id": 151644, "tts_pad_token_id": 151671, ...,
     "talker_config": {"text_config": {...MoE LM...}, "code_predictor_config": {...dense LM...},
                       "accept_hidden_layer": 24, "num_code_groups": 16, "codec_eos_token_id": 2150,
                       "speaker_id": {"chelsie": 2301, "ethan": 2302, "aiden": 2303}, ...},
     "code2wav_config": {...}}                       (top level, not inside talker_config)

Both spellings of the files in the wild are read: ``rope_parameters`` or
``rope_theta`` + ``rope_scaling``; ``num_experts`` or ``num_local_experts``.
The talker's 3-axis rope is always interleaved (transformers hard-codes it,
whatever the file's ``interleaved`` flag says).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from walkserve.core.errors import ConfigError
from walkserve.layers.rope_config import RopeConfig
from walkserve.models.common.config_files import read_config_json
from walkserve.models.common.lm_config import DTYPES, SILU, LMConfig

CONFIG_FILE = "config.json"


def _int(d: Mapping[str, Any], name: str, where: str, default: Any = None) -> int:
    value = d.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"{where}: {name} must be an integer, got {value!r}")
    return value


def _positive(obj: Any, names: tuple[str, ...], where: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"{where}: {name} must be a positive integer, got {value!r}")


def _dtype(top: Mapping[str, Any]) -> str:
    value = str(top.get("dtype") or top.get("torch_dtype") or "float32").removeprefix("torch.")
    if value not in DTYPES:
        raise ConfigError(f"unsupported dtype {value!r} in config.json (supported: {', '.join(DTYPES)})")
    return value


def _act(d: Mapping[str, Any], where: str) -> None:
    if d.get("hidden_act", "silu") not in SILU:
        raise ConfigError(f"{where}: hidden_act {d['hidden_act']!r} is not supported (only silu)")


@dataclass(frozen=True)
class AttentionShape:
    """The attention geometry shared by the three transformers of the speech path."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int

    @classmethod
    def from_hf(cls, d: Mapping[str, Any], where: str) -> AttentionShape:
        if d.get("attention_bias"):
            raise ConfigError(f"{where}: attention_bias is not supported")
        heads = _int(d, "num_attention_heads", where)
        hidden = _int(d, "hidden_size", where)
        shape = cls(
            hidden_size=hidden,
            num_hidden_layers=_int(d, "num_hidden_layers", where),
            num_attention_heads=heads,
            num_key_value_heads=_int(d, "num_key_value_heads", where) if d.get("num_key_value_heads") else heads,
            head_dim=d.get("head_dim") or hidden // heads,
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope=RopeConfig.from_hf(d),
            max_position_embeddings=_int(d, "max_position_embeddings", where, 32768),
        )
        _positive(shape, ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                          "head_dim", "max_position_embeddings"), where)
        if heads % shape.num_key_value_heads:
            raise ConfigError(f"{where}: {heads} attention heads are not a multiple of "
                              f"{shape.num_key_value_heads} key/value heads")
        return shape

    def as_lm_config(self, vocab_size: int, intermediate_size: int, qk_norm: bool = True) -> LMConfig:
        """The same geometry as a Qwen3 dense LM config (no biases): what ``common.decoder`` builds from."""
        return LMConfig(
            architecture="Qwen3ForCausalLM", hidden_size=self.hidden_size, intermediate_size=intermediate_size,
            num_hidden_layers=self.num_hidden_layers, num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim, vocab_size=vocab_size,
            rms_norm_eps=self.rms_norm_eps, qk_norm=qk_norm, max_position_embeddings=self.max_position_embeddings,
            rope=self.rope,
        )


class _Geometry:
    """The KV-cache component interface reads a transformer's geometry off its config directly: here, from its
    ``attention`` shape."""

    attention: AttentionShape

    @property
    def num_hidden_layers(self) -> int:
        return self.attention.num_hidden_layers

    @property
    def num_attention_heads(self) -> int:
        return self.attention.num_attention_heads

    @property
    def num_key_value_heads(self) -> int:
        return self.attention.num_key_value_heads

    @property
    def head_dim(self) -> int:
        return self.attention.head_dim

    @property
    def hidden_size(self) -> int:
        return self.attention.hidden_size


@dataclass(frozen=True)
class TalkerConfig(_Geometry):
    """The talker MoE LM (``talker.model``, ``talker.codec_head``, the two projections).

    Real checkpoint: 20 layers, hidden 1024, 16/2 heads of 128, 128 experts
    top-6 renormalised (SwiGLU 384), shared expert 768, vocab 3072.
    """

    attention: AttentionShape
    vocab_size: int
    num_experts: int
    num_experts_per_tok: int
    norm_topk_prob: bool
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    projection_intermediate_size: int  # text_config.intermediate_size: the width of text/hidden_projection
    thinker_hidden_size: int

    @classmethod
    def from_hf(cls, talker: Mapping[str, Any]) -> TalkerConfig:
        where = "talker_config.text_config"
        d = talker.get("text_config") or {}
        _act(d, where)
        if d.get("mlp_only_layers") or d.get("decoder_sparse_step", 1) != 1:
            raise ConfigError(f"{where}: dense (mlp_only) talker layers are not supported")
        attention = AttentionShape.from_hf(d, where)
        if attention.rope.mrope_section is None:
            raise ConfigError(f"{where}: the talker's rope needs an mrope_section")
        cfg = cls(
            attention=dataclasses.replace(attention, rope=dataclasses.replace(attention.rope, mrope_interleaved=True)),
            vocab_size=_int(d, "vocab_size", where),
            num_experts=_int(d, "num_experts", where, d.get("num_local_experts")),
            num_experts_per_tok=_int(d, "num_experts_per_tok", where),
            norm_topk_prob=bool(d.get("norm_topk_prob", False)),
            moe_intermediate_size=_int(d, "moe_intermediate_size", where),
            shared_expert_intermediate_size=_int(d, "shared_expert_intermediate_size", where),
            projection_intermediate_size=_int(d, "intermediate_size", where),
            thinker_hidden_size=_int(talker, "thinker_hidden_size", "talker_config"),
        )
        _positive(cfg, ("vocab_size", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                        "projection_intermediate_size", "thinker_hidden_size"), where)
        if cfg.num_experts_per_tok > cfg.num_experts:
            raise ConfigError(f"{where}: num_experts_per_tok {cfg.num_experts_per_tok} > num_experts {cfg.num_experts}")
        return cfg


@dataclass(frozen=True)
class CodePredictorConfig(_Geometry):
    """The dense depth model that writes codes 1..15 of a frame (``talker.code_predictor``).

    Real checkpoint: 5 layers, hidden 1024, 16/8 heads of 128, SwiGLU 3072,
    15 embeddings and 15 heads of 2048 codes. As a KV component its vocabulary
    is the 15 groups stacked: id ``g * codebook_size + code`` is code ``g + 1``.
    """

    attention: AttentionShape
    intermediate_size: int
    codebook_size: int  # vocab_size of each group's embedding and head
    num_code_groups: int  # 16: code 0 from the talker, codes 1..15 from here

    @property
    def num_residual_groups(self) -> int:
        return self.num_code_groups - 1

    @property
    def vocab_size(self) -> int:
        """The stacked vocabulary: one block of ``codebook_size`` ids per residual group."""
        return self.num_residual_groups * self.codebook_size

    @classmethod
    def from_hf(cls, talker: Mapping[str, Any]) -> CodePredictorConfig:
        where = "talker_config.code_predictor_config"
        d = talker.get("code_predictor_config") or {}
        _act(d, where)
        groups = _int(talker, "num_code_groups", "talker_config", d.get("num_code_groups"))
        window = d.get("sliding_window")
        types = d.get("layer_types") or []
        if window is not None and window < groups and (d.get("use_sliding_window") or "sliding_attention" in types):
            raise ConfigError(f"{where}: a sliding window of {window} is shorter than a frame's {groups} positions")
        cfg = cls(attention=AttentionShape.from_hf(d, where), intermediate_size=_int(d, "intermediate_size", where),
                  codebook_size=_int(d, "vocab_size", where), num_code_groups=groups)
        _positive(cfg, ("intermediate_size", "codebook_size"), where)
        if groups < 2:
            raise ConfigError(f"talker_config: num_code_groups must be >= 2, got {groups}")
        return cfg


@dataclass(frozen=True)
class Code2WavConfig:
    """The vocoder: codes [16, F] -> 24 kHz samples (``code2wav.``).

    Real checkpoint: codebook 2048 x 16 quantizers, hidden 1024, 8 pre-transformer
    layers (16 heads of 64, sliding window 72, SwiGLU 3072, LayerScale), upsampling
    ratios (2, 2), decoder_dim 1536 with rates (8, 5, 4, 3): 1920 samples per frame.
    """

    attention: AttentionShape
    codebook_size: int
    num_quantizers: int
    intermediate_size: int
    sliding_window: int
    upsampling_ratios: tuple[int, ...]
    upsample_rates: tuple[int, ...]
    decoder_dim: int
    sampling_rate: int = 24000

    @property
    def frame_samples(self) -> int:
        """Output samples per code frame (1920 for the release)."""
        out = 1
        for r in self.upsampling_ratios + self.upsample_rates:
            out *= r
        return out

    @classmethod
    def from_hf(cls, d: Mapping[str, Any]) -> Code2WavConfig:
        where = "code2wav_config"
        _act(d, where)
        cfg = cls(
            attention=AttentionShape.from_hf(d, where),
            codebook_size=_int(d, "codebook_size", where),
            num_quantizers=_int(d, "num_quantizers", where),
            intermediate_size=_int(d, "intermediate_size", where),
            sliding_window=_int(d, "sliding_window", where),
            upsampling_ratios=tuple(int(r) for r in d.get("upsampling_ratios", (2, 2))),
            upsample_rates=tuple(int(r) for r in d.get("upsample_rates", (8, 5, 4, 3))),
            decoder_dim=_int(d, "decoder_dim", where),
        )
        _positive(cfg, ("codebook_size", "num_quantizers", "intermediate_size", "sliding_window", "decoder_dim"), where)
        if any(r < 1 for r in cfg.upsampling_ratios + cfg.upsample_rates):
            raise ConfigError(f"{where}: upsampling ratios and rates must be >= 1")
        if cfg.decoder_dim % (2 ** len(cfg.upsample_rates)):
            raise ConfigError(f"{where}: decoder_dim {cfg.decoder_dim} must be divisible by "
                              f"2^{len(cfg.upsample_rates)} (it halves in every decoder block)")
        return cfg


@dataclass(frozen=True)
class SpeechTokens:
    """The ids the talker's input construction needs: thinker vocabulary and codec vocabulary."""

    im_start: int
    im_end: int
    system: int
    user: int
    assistant: int
    tts_pad: int
    tts_bos: int
    tts_eos: int
    audio_pad: int
    image_pad: int
    video_pad: int
    codec_pad: int
    codec_bos: int
    codec_eos: int
    codec_nothink: int
    codec_think_bos: int
    codec_think_eos: int

    @property
    def media_pads(self) -> tuple[int, int, int]:
        """Thinker ids whose talker input is the projected accept-layer state (audio, image, video)."""
        return (self.audio_pad, self.image_pad, self.video_pad)

    @classmethod
    def from_hf(cls, top: Mapping[str, Any], talker: Mapping[str, Any]) -> SpeechTokens:
        def top_id(name: str, default: int) -> int:
            return _int(top, name, "config.json", default)

        def talker_id(name: str) -> int:
            return _int(talker, name, "talker_config")

        return cls(
            im_start=top_id("im_start_token_id", 151644), im_end=top_id("im_end_token_id", 151645),
            system=top_id("system_token_id", 8948), user=top_id("user_token_id", 872),
            assistant=top_id("assistant_token_id", 77091), tts_pad=top_id("tts_pad_token_id", 151671),
            tts_bos=top_id("tts_bos_token_id", 151672), tts_eos=top_id("tts_eos_token_id", 151673),
            audio_pad=talker_id("audio_token_id"), image_pad=talker_id("image_token_id"),
            video_pad=talker_id("video_token_id"), codec_pad=talker_id("codec_pad_id"),
            codec_bos=talker_id("codec_bos_id"), codec_eos=talker_id("codec_eos_token_id"),
            codec_nothink=talker_id("codec_nothink_id"), codec_think_bos=talker_id("codec_think_bos_id"),
            codec_think_eos=talker_id("codec_think_eos_id"),
        )


@dataclass(frozen=True)
class SpeechConfig:
    """Everything the speech path reads from a Qwen3-Omni ``config.json``."""

    talker: TalkerConfig
    code_predictor: CodePredictorConfig
    code2wav: Code2WavConfig
    tokens: SpeechTokens
    speakers: Mapping[str, int]  # lower-cased name -> codec id, in the file's order
    accept_hidden_layer: int  # the thinker layer whose *input* feeds the talker at media positions
    dtype: str = "float32"  # the checkpoint's (top-level "dtype" or "torch_dtype")

    @property
    def num_code_groups(self) -> int:
        return self.code_predictor.num_code_groups

    @classmethod
    def from_hf(cls, top: Mapping[str, Any]) -> SpeechConfig:
        """Parse the config dict; ConfigError when it has no talker (a thinker-only checkpoint) or is malformed."""
        talker = top.get("talker_config")
        if not top.get("enable_audio_output", True) or not isinstance(talker, Mapping) or not top.get(
                "code2wav_config"):
            raise ConfigError("this Qwen3-Omni checkpoint has no talker/code2wav: it cannot speak (text output only)")
        speakers = talker.get("speaker_id")
        if not isinstance(speakers, Mapping) or not speakers:
            raise ConfigError("talker_config.speaker_id must map speaker names to codec ids")
        cfg = cls(
            talker=TalkerConfig.from_hf(talker),
            code_predictor=CodePredictorConfig.from_hf(talker),
            code2wav=Code2WavConfig.from_hf(top["code2wav_config"]),
            tokens=SpeechTokens.from_hf(top, talker),
            speakers={str(k).lower(): _int(speakers, k, "talker_config.speaker_id") for k in speakers},
            accept_hidden_layer=_int(talker, "accept_hidden_layer", "talker_config"),
            dtype=_dtype(top),
        )
        if cfg.talker.hidden_size != cfg.code_predictor.hidden_size:
            raise ConfigError(f"talker hidden {cfg.talker.hidden_size} != code predictor hidden "
                              f"{cfg.code_predictor.hidden_size}")
        if cfg.code2wav.num_quantizers != cfg.num_code_groups:
            raise ConfigError(f"code2wav num_quantizers {cfg.code2wav.num_quantizers} != "
                              f"num_code_groups {cfg.num_code_groups}")
        return cfg

    @classmethod
    def from_file(cls, path: str | Path) -> SpeechConfig:
        """Read ``config.json`` (the file, or the checkpoint directory holding it)."""
        return cls.from_hf(read_config_json(path, CONFIG_FILE))
