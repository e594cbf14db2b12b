"""State and action normalisation from a lerobot checkpoint's processor files (torch-free).

lerobot saves its processor pipelines beside the weights:

    policy_preprocessor.json    steps[...] {"registry_name": "normalizer_processor",
                                            "config": {"eps", "features", "norm_map"}, "state_file": ...}
    policy_postprocessor.json   steps[...] {"registry_name": "unnormalizer_processor", ...}
    <state_file>.safetensors    "<feature>.<stat>" -> [dim]   e.g. "observation.state.q01", "action.q99"

Modes, with d = hi - lo (eps instead when d == 0) and lerobot's eps (1e-8):

    QUANTILES   (q01, q99)   x -> 2 (x - q01) / d - 1        y -> (y + 1) d / 2 + q01   (pi0.5)
    QUANTILE10  (q10, q90)   likewise
    MIN_MAX     (min, max)   likewise
    MEAN_STD    (mean, std)  x -> (x - mean) / (std + eps)   y -> y std + mean          (pi0)
    IDENTITY                 unchanged

The state is normalised before it is binned (pi0.5) or padded to 32 (pi0);
actions are unnormalised after the chunk is sliced to the robot's dims.
Arithmetic is float32, as in lerobot.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from walkserve.core.errors import ConfigError

PREPROCESSOR = "policy_preprocessor.json"
POSTPROCESSOR = "policy_postprocessor.json"
_BOUNDS = {"QUANTILES": ("q01", "q99"), "QUANTILE10": ("q10", "q90"), "MIN_MAX": ("min", "max")}


@dataclass(frozen=True)
class FeatureNorm:
    """How one feature is normalised: the mode and its two statistics (float32 [dim])."""

    mode: str
    a: np.ndarray | None = None  # lo (q01, q10, min) or mean
    b: np.ndarray | None = None  # hi (q99, q90, max) or std
    eps: float = 1e-8

    def normalize(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        if self.mode == "IDENTITY":
            return x
        if self.mode == "MEAN_STD":
            return ((x - self.a) / (self.b + np.float32(self.eps))).astype(np.float32)
        return (np.float32(2.0) * (x - self.a) / self._span() - np.float32(1.0)).astype(np.float32)

    def unnormalize(self, y: np.ndarray) -> np.ndarray:
        y = np.asarray(y, dtype=np.float32)
        if self.mode == "IDENTITY":
            return y
        if self.mode == "MEAN_STD":
            return (y * self.b + self.a).astype(np.float32)
        return ((y + np.float32(1.0)) * self._span() / np.float32(2.0) + self.a).astype(np.float32)

    def _span(self) -> np.ndarray:
        span = self.b - self.a
        return np.where(span == 0, np.float32(self.eps), span).astype(np.float32)


IDENTITY = FeatureNorm("IDENTITY")


@dataclass(frozen=True)
class Normalizer:
    state: FeatureNorm = IDENTITY
    action: FeatureNorm = IDENTITY

    @staticmethod
    def from_dir(path: str | Path, state_dim: int, action_dim: int) -> Normalizer:
        """Read the checkpoint's processor files; features they do not normalise stay unchanged."""
        path = Path(path)
        state = _feature(path, PREPROCESSOR, "normalizer_processor", "observation.state", "STATE", state_dim)
        action = _feature(path, POSTPROCESSOR, "unnormalizer_processor", "action", "ACTION", action_dim)
        return Normalizer(state, action)


def _feature(path: Path, pipeline: str, registry: str, key: str, kind: str, dim: int) -> FeatureNorm:
    file = path / pipeline
    if not file.is_file():
        return IDENTITY
    try:
        steps = json.loads(file.read_text())["steps"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ConfigError(f"{file}: not a lerobot processor file ({e})") from None
    step = next((s for s in steps if s.get("registry_name") == registry), None)
    if step is None:
        return IDENTITY
    config = step.get("config") or {}
    mode = (config.get("norm_map") or {}).get(kind, "IDENTITY")
    if mode == "IDENTITY" or key not in (config.get("features") or {}):
        return IDENTITY
    names = _BOUNDS.get(mode, ("mean", "std") if mode == "MEAN_STD" else None)
    if names is None:
        raise ConfigError(f"{file}: normalisation mode {mode!r} for {key} is not supported")
    stats = _stats(path / step.get("state_file", ""), key, names)
    for name, value in zip(names, stats):
        if value.shape != (dim,):
            raise ConfigError(f"{file}: {key}.{name} has shape {list(value.shape)}, the config says [{dim}]")
    return FeatureNorm(mode, stats[0], stats[1], float(config.get("eps", 1e-8)))


def _stats(file: Path, key: str, names: tuple[str, str]) -> tuple[np.ndarray, np.ndarray]:
    from safetensors.numpy import load_file

    try:
        tensors = load_file(str(file))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{file}: cannot read normalisation statistics ({e})") from None
    missing = [f"{key}.{n}" for n in names if f"{key}.{n}" not in tensors]
    if missing:
        raise ConfigError(f"{file}: missing statistics {', '.join(missing)}")
    return tuple(tensors[f"{key}.{n}"].astype(np.float32) for n in names)  # type: ignore[return-value]
