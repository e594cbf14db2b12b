"""Validation of a policy request's inputs (torch-free): every error names the offending field.

The inputs are one flat mapping (``/v1/generate``'s ``inputs``, or an openpi
observation after ``observations.map_observation``):

    <camera>   an image per camera name of the checkpoint (``base_0_rgb`` ...): uint8 [H, W, 3]
               (or [3, H, W]; integers in 0..255 such as a JSON list), float [H, W, 3] in [0, 1],
               an ``ArrayData`` of those, or encoded image bytes (PNG, JPEG, ...)
    state      the robot state, state_dim numbers
    prompt     the task, a non-empty string (its token limit is checked when it is tokenised)
    noise      optional: the flow's initial noise, [chunk_size, max_action_dim] floats

Cameras the request lacks are masked out (openpi's DROID and LIBERO inputs
leave the right wrist out); ``InputSpec.required_cameras`` must be present.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from walkserve.core.array import ArrayData
from walkserve.core.errors import InvalidRequest
from walkserve.models.common.images import decode_rgb
from walkserve.models.pi0.config import PolicyConfig

STATE, PROMPT, NOISE = "state", "prompt", "noise"
MAX_PIXELS = 2048 * 2048


@dataclass(frozen=True)
class InputSpec:
    cameras: tuple[str, ...]
    required_cameras: tuple[str, ...]
    state_dim: int
    noise_shape: tuple[int, int]
    max_pixels: int = MAX_PIXELS

    @staticmethod
    def from_config(config: PolicyConfig, required_cameras: tuple[str, ...] | None = None,
                    max_pixels: int = MAX_PIXELS) -> InputSpec:
        """By default the checkpoint's first camera (the base view every openpi example sends) is required."""
        required = config.cameras[:1] if required_cameras is None else required_cameras
        return InputSpec(config.cameras, tuple(required), config.state_dim,
                         (config.chunk_size, config.max_action_dim), max_pixels)


@dataclass(frozen=True)
class PolicyInputs:
    images: dict[str, np.ndarray]  # camera -> uint8 [H, W, 3] or float32 [H, W, 3] in [0, 1]
    state: np.ndarray  # float32 [state_dim]
    prompt: str
    noise: np.ndarray | None = None  # float32 [H, 32]


def validate_inputs(spec: InputSpec, inputs: Mapping[str, Any]) -> PolicyInputs:
    """Check and convert; raises InvalidRequest whose ``param`` is ``inputs.<field>``."""
    known = {*spec.cameras, STATE, PROMPT, NOISE}
    for key in inputs:
        if key not in known:
            raise InvalidRequest(f"unknown input {key!r}; this policy takes the cameras {', '.join(spec.cameras)}, "
                                 f"{STATE}, {PROMPT} and optionally {NOISE}", param=f"inputs.{key}")
    for camera in spec.required_cameras:
        if inputs.get(camera) is None:
            raise InvalidRequest(f"the camera image {camera!r} is required", param=f"inputs.{camera}",
                                 code="missing_input")
    images = {c: to_image(inputs[c], spec.max_pixels, f"inputs.{c}") for c in spec.cameras if inputs.get(c) is not None}
    if not images:
        raise InvalidRequest(f"at least one camera image is required ({', '.join(spec.cameras)})",
                             param="inputs", code="missing_input")
    state = _vector(inputs.get(STATE), (spec.state_dim,), f"inputs.{STATE}")
    prompt = inputs.get(PROMPT)
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidRequest("the prompt must be a non-empty string", param=f"inputs.{PROMPT}",
                             code="missing_input" if prompt is None else "invalid_input")
    noise = inputs.get(NOISE)
    if noise is not None:
        noise = _vector(noise, spec.noise_shape, f"inputs.{NOISE}")
    return PolicyInputs(images, state, prompt, noise)


def to_image(value: Any, max_pixels: int, param: str) -> np.ndarray:
    """One camera image -> uint8 [H, W, 3], or float32 [H, W, 3] in [0, 1]."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return decode_rgb(bytes(value), max_pixels, param)
    array = _as_array(value, param)
    if array.ndim == 3 and array.shape[0] == 3 and array.shape[-1] != 3:
        array = array.transpose(1, 2, 0)  # [3, H, W] -> [H, W, 3]
    if array.ndim != 3 or array.shape[-1] != 3 or 0 in array.shape:
        raise InvalidRequest(f"an image must be [H, W, 3] (or [3, H, W]), got {list(array.shape)}", param=param,
                             code="invalid_image")
    if array.shape[0] * array.shape[1] > max_pixels:
        raise InvalidRequest(f"the image has {array.shape[1]}x{array.shape[0]} pixels; the limit is {max_pixels}",
                             param=param, code="image_too_large")
    if array.dtype == np.uint8:
        return np.ascontiguousarray(array)
    if array.dtype.kind in "iu":  # e.g. a JSON list of ints
        if array.min() < 0 or array.max() > 255:
            raise InvalidRequest("integer pixel values must be in 0..255", param=param, code="invalid_image")
        return array.astype(np.uint8)
    if array.dtype.kind != "f":
        raise InvalidRequest(f"an image must be uint8, or float in [0, 1]; got {array.dtype}", param=param,
                             code="invalid_image")
    array = array.astype(np.float32)
    if not np.isfinite(array).all() or array.min() < 0.0 or array.max() > 1.0:
        raise InvalidRequest("a float image must hold finite values in [0, 1]", param=param, code="invalid_image")
    return np.ascontiguousarray(array)


def _as_array(value: Any, param: str) -> np.ndarray:
    if isinstance(value, ArrayData):
        if value.dtype == "bfloat16":
            raise InvalidRequest("bfloat16 arrays are not accepted here", param=param, code="invalid_input")
        return np.frombuffer(value.data, dtype=np.dtype(value.dtype)).reshape(value.shape)
    try:
        array = np.asarray(value)
    except (ValueError, TypeError):
        array = None
    if array is None or array.dtype == object or array.dtype.kind not in "biuf":
        raise InvalidRequest("must be a numeric array", param=param, code="invalid_input")
    return array


def _vector(value: Any, shape: tuple[int, ...], param: str) -> np.ndarray:
    if value is None:
        raise InvalidRequest(f"is required ({list(shape)} numbers)", param=param, code="missing_input")
    array = _as_array(value, param)
    if array.dtype == np.bool_ or tuple(array.shape) != shape:
        raise InvalidRequest(f"must be {list(shape)} numbers, got {list(array.shape)}", param=param,
                             code="invalid_shape")
    array = array.astype(np.float32)
    if not np.isfinite(array).all():
        raise InvalidRequest("must hold finite numbers", param=param, code="invalid_input")
    return array
