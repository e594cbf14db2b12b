"""Qwen3OmniConfig: the thinker's parts of a Qwen3-Omni ``config.json`` (torch-free).

Layout of the released config (``Qwen3OmniMoeForConditionalGeneration``)::

    thinker_config: {text_config, audio_config, vision_config, audio_token_id, image_token_id, ...}
    talker_config:  {text_config, code_predictor_config, ...}      kept raw (``talker``)
    code2wav_config: {...}                                          kept raw (``code2wav``)
    im_start_token_id, im_end_token_id, tts_*_token_id, system/user/assistant_token_id, enable_audio_output

Both spellings of the releases are read: ``rope_scaling`` + ``rope_theta``
(transformers 4 files) or ``rope_parameters`` (transformers 5 saves);
``num_experts`` or ``num_local_experts``; ``torch_dtype`` or ``dtype``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from walkserve.core.errors import ConfigError
from walkserve.layers.rope_config import RopeConfig
from walkserve.models.common.config_files import RANDOM_WEIGHTS_KEY, read_config_json
from walkserve.models.common.lm_config import SILU

ARCHITECTURE = "Qwen3OmniMoeForConditionalGeneration"
MODEL_TYPE = "qwen3_omni_moe"
DTYPES = ("float32", "bfloat16", "float16")
DEFAULT_MROPE_SECTION = (24, 20, 20)


@dataclass(frozen=True)
class ThinkerTextConfig:
    """The thinker's MoE decoder (``thinker.model.*``, ``thinker.lm_head``)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    moe_intermediate_size: int
    num_experts: int
    num_experts_per_tok: int
    norm_topk_prob: bool = True
    intermediate_size: int = 0  # dense SwiGLU width of layers without experts (mlp_only_layers)
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 65536
    rope: RopeConfig = field(default_factory=lambda: RopeConfig(theta=1e6, mrope_section=DEFAULT_MROPE_SECTION,
                                                                mrope_interleaved=True))
    attention_bias: bool = False

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                     "head_dim", "vocab_size", "moe_intermediate_size", "num_experts", "num_experts_per_tok"):
            _positive(f"thinker text_config.{name}", getattr(self, name))
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError("thinker: num_attention_heads must be a multiple of num_key_value_heads")
        if not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ConfigError(f"thinker: num_experts_per_tok must be in [1, {self.num_experts}]")
        if self.rope.mrope_section is None or sum(self.rope.mrope_section) * 2 != self.rope.rotary_dim(self.head_dim):
            raise ConfigError(f"thinker: mrope_section {self.rope.mrope_section} must cover head_dim/2 frequencies")

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def is_moe_layer(self, layer: int) -> bool:
        """The rule of the reference: experts unless listed in mlp_only_layers or off the sparse step."""
        return layer not in self.mlp_only_layers and (layer + 1) % self.decoder_sparse_step == 0


@dataclass(frozen=True)
class AudioEncoderConfig:
    """``thinker.audio_tower``: log-mel chunks -> conv downsampling -> windowed transformer -> proj1/proj2."""

    num_mel_bins: int = 128
    d_model: int = 1280
    encoder_layers: int = 32
    encoder_attention_heads: int = 20
    encoder_ffn_dim: int = 5120
    downsample_hidden_size: int = 480
    output_dim: int = 2048
    n_window: int = 50  # a chunk is 2 * n_window mel frames
    n_window_infer: int = 800  # attention windows span n_window_infer mel frames
    max_source_positions: int = 1500
    activation_function: str = "gelu"

    def __post_init__(self) -> None:
        if self.activation_function != "gelu":
            raise ConfigError(f"audio encoder: activation {self.activation_function!r} is not supported (gelu)")
        if self.d_model % self.encoder_attention_heads:
            raise ConfigError("audio encoder: d_model must be a multiple of encoder_attention_heads")
        if self.n_window_infer % (2 * self.n_window):
            raise ConfigError("audio encoder: n_window_infer must be a multiple of 2 * n_window")

    @property
    def conv_freq_bins(self) -> int:
        """Mel bins left after the three stride-2 convolutions (128 -> 16)."""
        bins = self.num_mel_bins
        for _ in range(3):
            bins = (bins + 1) // 2
        return bins


@dataclass(frozen=True)
class VisionEncoderConfig:
    """``thinker.visual``: Qwen3-VL style ViT with a merger and deepstack mergers."""

    depth: int = 27
    hidden_size: int = 1152
    intermediate_size: int = 4304
    num_heads: int = 16
    in_channels: int = 3
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    out_hidden_size: int = 2048
    num_position_embeddings: int = 2304
    deepstack_visual_indexes: tuple[int, ...] = (8, 16, 24)
    hidden_act: str = "gelu_pytorch_tanh"
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        if self.hidden_act not in ("gelu_pytorch_tanh", "gelu"):
            raise ConfigError(f"vision encoder: activation {self.hidden_act!r} is not supported")
        side = math.isqrt(self.num_position_embeddings)
        if side * side != self.num_position_embeddings:
            raise ConfigError("vision encoder: num_position_embeddings must be a square")
        if any(not 0 <= i < self.depth for i in self.deepstack_visual_indexes):
            raise ConfigError(f"vision encoder: deepstack_visual_indexes {self.deepstack_visual_indexes} out of range")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Values of one flattened patch: C x temporal x p x p."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size**2


@dataclass(frozen=True)
class OmniTokenIds:
    """Special ids the thinker's prompt and positions depend on (release values as defaults)."""

    audio_token_id: int = 151675
    image_token_id: int = 151655
    video_token_id: int = 151656
    audio_start_token_id: int = 151669
    vision_start_token_id: int = 151652
    im_start_token_id: int = 151644
    im_end_token_id: int = 151645
    system_token_id: int = 8948
    user_token_id: int = 872
    assistant_token_id: int = 77091
    tts_pad_token_id: int = 151671
    tts_bos_token_id: int = 151672
    tts_eos_token_id: int = 151673


@dataclass(frozen=True)
class Qwen3OmniConfig:
    """A whole Qwen3-Omni checkpoint; the speech half's sections are kept as parsed JSON."""

    text: ThinkerTextConfig
    audio: AudioEncoderConfig | None
    vision: VisionEncoderConfig | None
    tokens: OmniTokenIds = field(default_factory=OmniTokenIds)
    position_id_per_seconds: float = 13.0
    enable_audio_output: bool = False
    talker: Mapping[str, Any] | None = None  # raw "talker_config"
    code2wav: Mapping[str, Any] | None = None  # raw "code2wav_config"
    dtype: str = "bfloat16"
    random_weights: bool = False

    @classmethod
    def from_file(cls, path: str | Path) -> Qwen3OmniConfig:
        """Read ``config.json`` (a file, or a checkpoint directory holding one)."""
        return cls.from_hf(read_config_json(path))

    @classmethod
    def from_hf(cls, d: Mapping[str, Any]) -> Qwen3OmniConfig:
        """Parse an HF config dict (transformers 4 or 5 spelling)."""
        if not is_qwen3_omni(d):
            raise ConfigError(f"not a Qwen3-Omni config (architectures={d.get('architectures')}, "
                              f"model_type={d.get('model_type')!r})")
        thinker = _section(d, "thinker_config", required=True)
        audio, vision = thinker.get("audio_config"), thinker.get("vision_config")
        return cls(
            text=thinker_text_config(_section(thinker, "text_config", required=True)),
            audio=None if audio is None else audio_encoder_config(audio),
            vision=None if vision is None else vision_encoder_config(vision),
            tokens=_token_ids(d, thinker),
            position_id_per_seconds=float(thinker.get("position_id_per_seconds", 25)),
            enable_audio_output=bool(d.get("enable_audio_output", False)),
            talker=d.get("talker_config"),
            code2wav=d.get("code2wav_config"),
            dtype=_dtype(d),
            random_weights=d.get(RANDOM_WEIGHTS_KEY) is True,
        )


def is_qwen3_omni(d: Mapping[str, Any]) -> bool:
    """True for a Qwen3-Omni top-level config dict (by architecture or model_type)."""
    return ARCHITECTURE in (d.get("architectures") or []) or d.get("model_type") == MODEL_TYPE


def thinker_text_config(t: Mapping[str, Any]) -> ThinkerTextConfig:
    hidden, heads = _required(t, "hidden_size"), _required(t, "num_attention_heads")
    if t.get("hidden_act", "silu") not in SILU:
        raise ConfigError(f"thinker: hidden_act {t['hidden_act']!r} is not supported (silu)")
    if t.get("sliding_window") and t.get("use_sliding_window"):
        raise ConfigError("thinker: sliding-window attention is not supported")
    rope = RopeConfig.from_hf(t)
    # the reference always interleaves the three axes (the flag in the file is informational)
    rope = dataclasses.replace(rope, mrope_section=rope.mrope_section or DEFAULT_MROPE_SECTION, mrope_interleaved=True)
    experts = t.get("num_experts", t.get("num_local_experts"))
    return ThinkerTextConfig(
        hidden_size=hidden,
        num_hidden_layers=_required(t, "num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=t.get("num_key_value_heads") or heads,
        head_dim=t.get("head_dim") or hidden // heads,
        vocab_size=_required(t, "vocab_size"),
        moe_intermediate_size=_required(t, "moe_intermediate_size"),
        num_experts=experts if experts is not None else 128,
        num_experts_per_tok=t.get("num_experts_per_tok", 8),
        norm_topk_prob=bool(t.get("norm_topk_prob", True)),
        intermediate_size=t.get("intermediate_size") or 0,
        decoder_sparse_step=t.get("decoder_sparse_step") or 1,
        mlp_only_layers=tuple(t.get("mlp_only_layers") or ()),
        rms_norm_eps=float(t.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=t.get("max_position_embeddings") or 65536,
        rope=rope,
        attention_bias=bool(t.get("attention_bias", False)),
    )


def audio_encoder_config(a: Mapping[str, Any]) -> AudioEncoderConfig:
    names = {f.name for f in dataclasses.fields(AudioEncoderConfig)}
    return AudioEncoderConfig(**{k: a[k] for k in names if k in a})


def vision_encoder_config(v: Mapping[str, Any]) -> VisionEncoderConfig:
    names = {f.name for f in dataclasses.fields(VisionEncoderConfig)} - {"rope_theta", "deepstack_visual_indexes"}
    kw = {k: v[k] for k in names if k in v}
    for key in ("patch_size", "temporal_patch_size"):
        if isinstance(kw.get(key), list | tuple):  # some configs spell a square patch as [p, p]
            kw[key] = int(kw[key][0])
    rope = v.get("rope_parameters") or {}
    return VisionEncoderConfig(
        **kw,
        deepstack_visual_indexes=tuple(v.get("deepstack_visual_indexes", (8, 16, 24))),
        rope_theta=float(rope.get("rope_theta", v.get("rope_theta", 10000.0))),
    )


def _token_ids(d: Mapping[str, Any], thinker: Mapping[str, Any]) -> OmniTokenIds:
    defaults = OmniTokenIds()
    values = {}
    for f in dataclasses.fields(OmniTokenIds):
        value = thinker.get(f.name, d.get(f.name, getattr(defaults, f.name)))
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{f.name} must be an integer, got {value!r}")
        values[f.name] = value
    return OmniTokenIds(**values)


def _section(d: Mapping[str, Any], key: str, required: bool = False) -> Mapping[str, Any]:
    value = d.get(key)
    if value is None and required:
        raise ConfigError(f"Qwen3-Omni config lacks {key}")
    if value is not None and not isinstance(value, Mapping):
        raise ConfigError(f"{key} must be an object")
    return value or {}


def _required(d: Mapping[str, Any], name: str) -> Any:
    if d.get(name) is None:
        raise ConfigError(f"thinker text_config lacks {name}")
    return d[name]


def _positive(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def _dtype(d: Mapping[str, Any]) -> str:
    value = d.get("dtype") or d.get("torch_dtype") or "bfloat16"
    if isinstance(value, str) and value.startswith("torch."):
        value = value[len("torch."):]
    if value not in DTYPES:
        raise ConfigError(f"unsupported dtype {value!r} in config (supported: {', '.join(DTYPES)})")
    return value
