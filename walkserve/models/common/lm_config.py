"""LMConfig: a dense decoder-only LM (Llama, Qwen2, Qwen3) as read from an HF ``config.json``.

Torch-free, so the API process can read context length and stop ids.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from walkserve.core.errors import ConfigError
from walkserve.layers.rope_config import RopeConfig
from walkserve.models.common.config_files import RANDOM_WEIGHTS_KEY, read_config_json

ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
_BY_MODEL_TYPE = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
_DEFAULT_MAX_POSITIONS = {"LlamaForCausalLM": 2048, "Qwen2ForCausalLM": 32768, "Qwen3ForCausalLM": 32768}
# transformers' head_dim where config.json has none, if not hidden_size // num_attention_heads
_DEFAULT_HEAD_DIM = {"Qwen3ForCausalLM": 128}
DTYPES = ("float32", "bfloat16", "float16")
SILU = ("silu", "swish")  # transformers' two names of one activation


@dataclass(frozen=True)
class LMConfig:
    """Shape and quirks of one decoder-only LM.

    Bias placement differs per family: Llama applies ``attention_bias`` to
    q/k/v/o; Qwen2 always has q/k/v bias and no o bias; Qwen3 applies
    ``attention_bias`` to q/k/v/o and adds per-head RMSNorm on q and k.
    """

    architecture: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    max_position_embeddings: int = 2048
    rope: RopeConfig = field(default_factory=RopeConfig)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    dtype: str = "float32"
    random_weights: bool = False  # config.json "walkserve_random_weights": a tiny random checkpoint

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ConfigError(
                f"unsupported architecture {self.architecture!r} (supported: {', '.join(ARCHITECTURES)})"
            )
        for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{self.architecture}: {name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.dtype not in DTYPES:
            raise ConfigError(f"unsupported dtype {self.dtype!r} (supported: {', '.join(DTYPES)})")
        if not self.rms_norm_eps > 0:
            raise ConfigError(f"rms_norm_eps must be > 0, got {self.rms_norm_eps}")
        self.rope.rotary_dim(self.head_dim)

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def family(self) -> str:
        """``llama``, ``qwen2`` or ``qwen3``."""
        return {v: k for k, v in _BY_MODEL_TYPE.items()}[self.architecture]

    @classmethod
    def from_file(cls, path: str | Path) -> LMConfig:
        """Read ``config.json`` (a file, or a checkpoint directory holding one)."""
        return cls.from_hf(read_config_json(path))

    @classmethod
    def from_hf(cls, d: Mapping[str, Any]) -> LMConfig:
        """Parse an HF config dict (transformers 4 or 5 spelling)."""
        arch = _architecture(d)
        if d.get("hidden_act", "silu") not in SILU:
            raise ConfigError(f"{arch}: hidden_act {d['hidden_act']!r} is not supported (only silu)")
        _reject_sliding_window(arch, d)
        hidden, heads = _required(d, "hidden_size", arch), _required(d, "num_attention_heads", arch)
        attention_bias = _flag(d, "attention_bias", arch)
        qwen2 = arch == "Qwen2ForCausalLM"
        max_positions = d.get("max_position_embeddings") or _DEFAULT_MAX_POSITIONS[arch]
        rope = RopeConfig.from_hf({**d, "max_position_embeddings": max_positions})  # llama3's fallback length
        if rope.partial_rotary_factor != 1.0:  # transformers rotates the whole head for these families
            raise ConfigError(f"{arch}: partial_rotary_factor {rope.partial_rotary_factor} is not supported (only 1.0)")
        return cls(
            architecture=arch,
            hidden_size=hidden,
            intermediate_size=_required(d, "intermediate_size", arch),
            num_hidden_layers=_required(d, "num_hidden_layers", arch),
            num_attention_heads=heads,
            num_key_value_heads=_optional(d, "num_key_value_heads", heads),
            head_dim=_optional(d, "head_dim", _DEFAULT_HEAD_DIM.get(arch) or _floor_div(hidden, heads)),
            vocab_size=_required(d, "vocab_size", arch),
            rms_norm_eps=_float(d, "rms_norm_eps", 1e-6, arch),
            tie_word_embeddings=_flag(d, "tie_word_embeddings", arch),
            qkv_bias=True if qwen2 else attention_bias,
            o_bias=False if qwen2 else attention_bias,
            mlp_bias=_flag(d, "mlp_bias", arch) if arch == "LlamaForCausalLM" else False,
            qk_norm=arch == "Qwen3ForCausalLM",
            max_position_embeddings=max_positions,
            rope=rope,
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=_ids(d.get("eos_token_id")),
            pad_token_id=d.get("pad_token_id"),
            dtype=_dtype(d),
            random_weights=d.get(RANDOM_WEIGHTS_KEY) is True,
        )


def _architecture(d: Mapping[str, Any]) -> str:
    archs = d.get("architectures")
    if archs:
        if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
            raise ConfigError(f"architectures must be a list of names, got {archs!r}")
        return archs[0]
    model_type = d.get("model_type")
    if model_type in _BY_MODEL_TYPE:
        return _BY_MODEL_TYPE[model_type]
    raise ConfigError(f"config names no supported architecture (architectures=None, model_type={model_type!r})")


def _required(d: Mapping[str, Any], name: str, arch: str) -> Any:
    if d.get(name) is None:
        raise ConfigError(f"{arch}: config.json lacks {name}")
    return d[name]


def _optional(d: Mapping[str, Any], name: str, default: Any) -> Any:
    """``d[name]``, or ``default`` where it is absent or null (0 stays 0, for the positivity check to refuse)."""
    value = d.get(name)
    return default if value is None else value


def _floor_div(a: Any, b: Any) -> Any:
    """``a // b`` for positive integers; anything else is passed on for ``__post_init__`` to refuse."""
    ok = all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (a, b))
    return a // b if ok else a


def _float(d: Mapping[str, Any], name: str, default: float, arch: str) -> float:
    value = d.get(name, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ConfigError(f"{arch}: {name} must be a number, got {value!r}")
    return float(value)


def _flag(d: Mapping[str, Any], name: str, arch: str) -> bool:
    """A true/false field (absent or null: false); a string such as "false" is refused, not read as true."""
    value = d.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ConfigError(f"{arch}: {name} must be true or false, got {value!r}")
    return value


def _reject_sliding_window(arch: str, d: Mapping[str, Any]) -> None:
    """Refuse a config with a sliding-window layer, read as transformers reads it: its ``layer_types`` when given,
    else (Qwen2, Qwen3) layer i slides when ``use_sliding_window`` is set, ``sliding_window`` is not null and
    i >= ``max_window_layers`` (28 when absent), so a window that starts past the last layer slides none."""
    layer_types = d.get("layer_types")
    if layer_types:
        slides = any(t != "full_attention" for t in layer_types)
    elif d.get("use_sliding_window") and d.get("sliding_window", 4096) is not None:
        first = d.get("max_window_layers", 28)
        layers = d.get("num_hidden_layers")
        slides = not (isinstance(first, int) and isinstance(layers, int) and first >= layers)
    else:
        slides = False
    if slides:
        raise ConfigError(f"{arch}: sliding-window attention layers are not supported")


def _ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return tuple(value)
    raise ConfigError(f"eos_token_id must be an integer or a list of integers, got {value!r}")


def _dtype(d: Mapping[str, Any]) -> str:
    value = d.get("dtype") or d.get("torch_dtype") or "float32"
    if isinstance(value, str) and value.startswith("torch."):
        value = value[len("torch."):]
    if value not in DTYPES:
        raise ConfigError(f"unsupported dtype {value!r} in config (supported: {', '.join(DTYPES)})")
    return value


def checkpoint_eos_ids(path: Path, config: LMConfig) -> tuple[int, ...]:
    """config.json eos ids, then any extra ones from generation_config.json."""
    ids = list(config.eos_token_ids)
    gen = path / "generation_config.json"
    if gen.is_file():
        try:
            value = json.loads(gen.read_text()).get("eos_token_id")
        except (json.JSONDecodeError, AttributeError):
            raise ConfigError(f"{gen}: invalid generation config") from None
        ids.extend([value] if isinstance(value, int) else [v for v in value or [] if isinstance(v, int)])
    return tuple(dict.fromkeys(ids))
