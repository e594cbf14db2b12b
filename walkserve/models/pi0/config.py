"""PolicyConfig: a pi0 / pi0.5 checkpoint's ``config.json`` as lerobot writes it (torch-free).

lerobot's file names the transformer sizes only by variant (``paligemma_variant``
"gemma_2b", ``action_expert_variant`` "gemma_300m") and implies the So400m/14
vision tower and PaliGemma's 257,152-token vocabulary. Tiny checkpoints
written by ``walkserve tiny pi0|pi05`` add a ``walkserve_sizes`` object with
explicit sizes instead (and ``walkserve_random_weights``).

    input_features   "observation.images.<camera>": VISUAL [3, H, W]   (camera order = prefix order)
                     "observation.state": STATE [state_dim]
    output_features  "action": ACTION [action_dim]   (the model's 32 dims are sliced to this)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from walkserve.core.errors import ConfigError
from walkserve.models.siglip.config import SiglipVisionConfig

KINDS = ("pi0", "pi05")
IMAGE_PREFIX = "observation.images."
STATE_KEY = "observation.state"
ACTION_KEY = "action"
PALIGEMMA_VOCAB = 257152
NORM_MODES = ("IDENTITY", "MEAN_STD", "MIN_MAX", "QUANTILES", "QUANTILE10")
RANDOM_WEIGHTS_KEY = "walkserve_random_weights"
SIZES_KEY = "walkserve_sizes"


@dataclass(frozen=True)
class GemmaSize:
    """One Gemma stack. Names follow the KV-component seam (``hidden_size``, ``num_hidden_layers`` ...)."""

    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
                     "num_key_value_heads", "head_dim"):
            if int(getattr(self, name)) <= 0:
                raise ConfigError(f"gemma: {name} must be > 0, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(f"gemma: {self.num_attention_heads} heads are not a multiple of "
                              f"{self.num_key_value_heads} KV heads")

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> GemmaSize:
        """From lerobot's variant fields (width, depth, mlp_dim, num_heads, num_kv_heads, head_dim)."""
        try:
            return GemmaSize(int(d["width"]), int(d["depth"]), int(d["mlp_dim"]), int(d["num_heads"]),
                             int(d["num_kv_heads"]), int(d["head_dim"]))
        except KeyError as e:
            raise ConfigError(f"gemma size: missing {e.args[0]!r}") from None

    def to_dict(self) -> dict[str, int]:
        return {"width": self.hidden_size, "depth": self.num_hidden_layers, "mlp_dim": self.intermediate_size,
                "num_heads": self.num_attention_heads, "num_kv_heads": self.num_key_value_heads,
                "head_dim": self.head_dim}


VARIANTS = {
    "gemma_2b": GemmaSize(2048, 18, 16384, 8, 1, 256),
    "gemma_300m": GemmaSize(1024, 18, 4096, 8, 1, 256),
}
SO400M = SiglipVisionConfig()  # 27 x 1152, 16 heads, MLP 4304, 224 px, patch 14


@dataclass(frozen=True)
class PolicyConfig:
    """Everything the pi0 family reads from a checkpoint's config.json."""

    kind: str  # "pi0" | "pi05"
    paligemma: GemmaSize
    expert: GemmaSize
    vision: SiglipVisionConfig
    cameras: tuple[str, ...]
    state_dim: int
    action_dim: int
    vocab_size: int = PALIGEMMA_VOCAB
    chunk_size: int = 50
    n_action_steps: int = 50
    max_state_dim: int = 32
    max_action_dim: int = 32
    num_inference_steps: int = 10
    min_period: float = 4e-3
    max_period: float = 4.0
    image_resolution: tuple[int, int] = (224, 224)
    tokenizer_max_length: int = 200
    discrete_state_input: bool = True  # pi05: the state as bins in the prompt
    normalization: Mapping[str, str] = field(default_factory=dict)  # "STATE"/"ACTION"/"VISUAL" -> mode
    dtype: str = "float32"
    random_weights: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"policy type {self.kind!r} is not one of {', '.join(KINDS)}")
        if not self.cameras:
            raise ConfigError("config.json: input_features names no camera (observation.images.*)")
        if not 0 < self.state_dim <= self.max_state_dim:
            raise ConfigError(f"state dim {self.state_dim} must be in 1..max_state_dim {self.max_state_dim}")
        if not 0 < self.action_dim <= self.max_action_dim:
            raise ConfigError(f"action dim {self.action_dim} must be in 1..max_action_dim {self.max_action_dim}")
        if self.paligemma.num_hidden_layers != self.expert.num_hidden_layers:
            raise ConfigError("the action expert needs as many layers as the PaliGemma LM (layer l reads layer l)")
        if (self.paligemma.num_key_value_heads, self.paligemma.head_dim) != (
                self.expert.num_key_value_heads, self.expert.head_dim):
            raise ConfigError("the action expert's KV heads and head_dim must equal the PaliGemma LM's")
        if self.image_resolution[0] != self.image_resolution[1]:
            raise ConfigError(f"image_resolution must be square, got {list(self.image_resolution)}")
        for key, mode in self.normalization.items():
            if mode not in NORM_MODES:
                raise ConfigError(f"normalization_mapping[{key!r}] = {mode!r} is not one of {', '.join(NORM_MODES)}")

    @property
    def pi05(self) -> bool:
        return self.kind == "pi05"

    @property
    def state_in_prompt(self) -> bool:
        return self.pi05 and self.discrete_state_input

    @property
    def image_tokens(self) -> int:
        """Prefix tokens per camera image (256 for So400m/14 at 224)."""
        return (self.image_resolution[0] // self.vision.patch_size) ** 2

    @property
    def suffix_tokens(self) -> int:
        """Expert tokens per flow step: the H action tokens (pi0 also has its state token, written once)."""
        return self.chunk_size

    @property
    def max_prefix_tokens(self) -> int:
        return len(self.cameras) * self.image_tokens + self.tokenizer_max_length

    @staticmethod
    def from_file(path: str | Path) -> PolicyConfig:
        path = Path(path)
        file = path / "config.json" if path.is_dir() else path
        try:
            raw = json.loads(file.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"{file}: cannot read config.json ({e})") from None
        return PolicyConfig.from_dict(raw, source=str(file))

    @staticmethod
    def from_dict(raw: Mapping[str, Any], source: str = "config.json") -> PolicyConfig:
        kind = raw.get("type")
        if kind not in KINDS:
            raise ConfigError(f"{source}: \"type\" is {kind!r}, expected one of {', '.join(KINDS)}")
        sizes = raw.get(SIZES_KEY) or {}
        paligemma = _gemma(raw, sizes, "paligemma", "paligemma_variant", "gemma_2b", source)
        expert = _gemma(raw, sizes, "expert", "action_expert_variant", "gemma_300m", source)
        vision = SiglipVisionConfig.from_dict(sizes["vision"]) if "vision" in sizes else SO400M
        inputs, outputs = raw.get("input_features") or {}, raw.get("output_features") or {}
        cameras = tuple(k[len(IMAGE_PREFIX):] for k, v in inputs.items()
                        if k.startswith(IMAGE_PREFIX) and _feature_type(v) == "VISUAL")
        max_state, max_action = int(raw.get("max_state_dim", 32)), int(raw.get("max_action_dim", 32))
        resolution = tuple(int(x) for x in raw.get("image_resolution", (224, 224)))
        return PolicyConfig(
            kind=kind, paligemma=paligemma, expert=expert, vision=vision, cameras=cameras,
            state_dim=_feature_dim(inputs.get(STATE_KEY), max_state),
            action_dim=_feature_dim(outputs.get(ACTION_KEY), max_action),
            vocab_size=int(sizes.get("vocab_size", PALIGEMMA_VOCAB)),
            chunk_size=int(raw.get("chunk_size", 50)), n_action_steps=int(raw.get("n_action_steps", 50)),
            max_state_dim=max_state, max_action_dim=max_action,
            num_inference_steps=int(raw.get("num_inference_steps", 10)),
            min_period=float(raw.get("min_period", 4e-3)), max_period=float(raw.get("max_period", 4.0)),
            image_resolution=resolution,  # type: ignore[arg-type]
            tokenizer_max_length=int(raw.get("tokenizer_max_length", 200 if kind == "pi05" else 48)),
            discrete_state_input=bool(raw.get("discrete_state_input", True)),
            normalization=dict(raw.get("normalization_mapping") or {}),
            dtype=str(raw.get("dtype", "float32")),
            random_weights=bool(raw.get(RANDOM_WEIGHTS_KEY, False)),
        )


def _gemma(raw: Mapping[str, Any], sizes: Mapping[str, Any], name: str, key: str, default: str,
           source: str) -> GemmaSize:
    if name in sizes:
        return GemmaSize.from_dict(sizes[name])
    variant = raw.get(key, default)
    if variant not in VARIANTS:
        raise ConfigError(f"{source}: {key} {variant!r} is not one of {', '.join(VARIANTS)}")
    return VARIANTS[variant]


def _feature_type(feature: Any) -> str | None:
    return feature.get("type") if isinstance(feature, Mapping) else None


def _feature_dim(feature: Any, default: int) -> int:
    if not isinstance(feature, Mapping) or not feature.get("shape"):
        return default
    return int(feature["shape"][0])
