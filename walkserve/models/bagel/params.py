"""The request parameters of BAGEL's image routes (``/v1/images/generations`` and ``/v1/images/edits``
extensions), as a torch-free msgspec struct; every error names its field.

Defaults are the official app's, per task (``TASK_DEFAULTS``):

    task        num_timesteps  cfg_text  cfg_img  cfg_interval  renorm         renorm_min  shift  size
    generate    50             4.0       1.5      [0.4, 1.0]    global         0.0         3.0    1024x1024 *
    edit        50             4.0       2.0      [0.0, 1.0]    text_channel   0.0         3.0    the input's

(The app passes no cfg_img_scale for text-to-image, so the inferencer's 1.5
applies.) An edit keeps its input's (VAE-resized) size, so it takes no ``size``.
* Or, on a checkpoint whose latent position table covers less than 1024 px, its
largest side (``ImageLimits.max_side``); ``size`` left out or ``auto`` takes it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from walkserve.core.errors import InvalidRequest
from walkserve.core.params import Params

GENERATE, EDIT = "generate", "edit"
RENORM_TYPES = ("global", "channel", "text_channel")
MAX_SCALE = 20.0
MAX_TIMESTEPS = 1000
MAX_SHIFT = 100.0
SIZE_STRIDE = 16


@dataclass(frozen=True)
class ImageLimits:
    """Caps the server applies: sides in [min_side, max_side] (the latent table covers 1024)."""

    max_side: int = 1024
    min_side: int = 16


@dataclass(frozen=True)
class ImageSettings:
    """Every field filled in for one task."""

    num_timesteps: int
    cfg_text_scale: float
    cfg_img_scale: float
    cfg_interval: tuple[float, float]
    cfg_renorm_type: str
    cfg_renorm_min: float
    timestep_shift: float
    think: bool = False
    size: tuple[int, int] | None = None  # (width, height); None for an edit: the input's


TASK_DEFAULTS = {
    GENERATE: ImageSettings(50, 4.0, 1.5, (0.4, 1.0), "global", 0.0, 3.0, size=(1024, 1024)),
    EDIT: ImageSettings(50, 4.0, 2.0, (0.0, 1.0), "text_channel", 0.0, 3.0, size=None),
}


class BagelImageParams(Params, frozen=True, tag="bagel"):
    """What a client may set; None takes the task's default.

    ``size`` is ``"WIDTHxHEIGHT"`` or, as the image routes pass it, ``[width, height]``;
    ``steps`` (the image routes' generic field) counts Euler steps: ``num_timesteps - 1``.
    """

    num_timesteps: int | None = None
    cfg_text_scale: float | None = None
    cfg_img_scale: float | None = None
    cfg_interval: tuple[float, float] | None = None
    cfg_renorm_type: Literal["global", "channel", "text_channel"] | None = None
    cfg_renorm_min: float | None = None
    timestep_shift: float | None = None
    think: bool = False
    size: str | tuple[int, int] | None = None
    steps: int | None = None

    def resolve(self, task: str, limits: ImageLimits = ImageLimits()) -> ImageSettings:
        """The settings for ``task`` (``generate`` or ``edit``); raises InvalidRequest naming the field."""
        if task not in TASK_DEFAULTS:
            raise ValueError(f"unknown task {task!r}")
        d = TASK_DEFAULTS[task]
        num_timesteps = self._num_timesteps()
        for name in ("cfg_text_scale", "cfg_img_scale"):
            _check_range(name, getattr(self, name), 0.0, MAX_SCALE)
        _check_range("cfg_renorm_min", self.cfg_renorm_min, 0.0, 1.0)
        if self.timestep_shift is not None and not 0.0 < self.timestep_shift <= MAX_SHIFT:
            raise InvalidRequest(f"timestep_shift must be in (0, {MAX_SHIFT:g}], got {self.timestep_shift}", "timestep_shift")
        _check_interval(self.cfg_interval)
        size = default_size(d.size, limits) if task == GENERATE else None
        if self.size not in (None, "", "auto"):
            if task == EDIT:
                raise InvalidRequest("an edit keeps the input image's size; leave size out (or auto)", "size")
            size = parse_size(self.size, limits)
        return ImageSettings(
            num_timesteps=_pick(num_timesteps, d.num_timesteps),
            cfg_text_scale=float(_pick(self.cfg_text_scale, d.cfg_text_scale)),
            cfg_img_scale=float(_pick(self.cfg_img_scale, d.cfg_img_scale)),
            cfg_interval=tuple(float(v) for v in _pick(self.cfg_interval, d.cfg_interval)),
            cfg_renorm_type=_pick(self.cfg_renorm_type, d.cfg_renorm_type),
            cfg_renorm_min=float(_pick(self.cfg_renorm_min, d.cfg_renorm_min)),
            timestep_shift=float(_pick(self.timestep_shift, d.timestep_shift)),
            think=self.think,
            size=size,
        )


    def _num_timesteps(self) -> int | None:
        if self.steps is not None:
            if self.num_timesteps is not None:
                raise InvalidRequest("give num_timesteps or steps (= num_timesteps - 1), not both", "steps")
            _check_range("steps", self.steps, 1, MAX_TIMESTEPS - 1)
            return self.steps + 1
        _check_range("num_timesteps", self.num_timesteps, 2, MAX_TIMESTEPS)
        return self.num_timesteps


class BagelRun(Params, frozen=True, tag="bagel.run"):
    """What a BAGEL request carries past its processor: its flow and, for an image, every setting resolved
    (``ImageSettings``, the output's size in pixels). The defaults are text-to-image's."""

    flow: Literal["text_to_image", "edit", "understand"]
    think: bool = False
    height: int = 0  # text-to-image: the output's size (an edit keeps its input's)
    width: int = 0
    num_timesteps: int = 50
    cfg_text_scale: float = 4.0
    cfg_img_scale: float = 1.5
    cfg_interval: tuple[float, float] = (0.4, 1.0)
    cfg_renorm_type: str = "global"
    cfg_renorm_min: float = 0.0
    timestep_shift: float = 3.0


def parse_image_params(data: Mapping[str, Any]) -> BagelImageParams:
    """A JSON-like mapping -> the struct; a wrong type or an unknown field is an InvalidRequest naming it."""
    try:
        return msgspec.convert(dict(data), BagelImageParams, strict=False)
    except msgspec.ValidationError as e:
        text = str(e)
        field = None
        if "$." in text:
            field = text.split("$.", 1)[1].split("`", 1)[0].split("[", 1)[0]
        elif "unknown field" in text.lower():
            field = text.split("`")[1] if "`" in text else None
        raise InvalidRequest(text, field) from None


def default_size(size: tuple[int, int], limits: ImageLimits) -> tuple[int, int]:
    """The task's default size (the release's 1024x1024), each side cut to the largest multiple of 16 the
    checkpoint's latent position table covers; checked like a given size."""
    side = limits.max_side // SIZE_STRIDE * SIZE_STRIDE
    return parse_size((min(size[0], side), min(size[1], side)), limits)


def parse_size(size: str | tuple[int, int], limits: ImageLimits) -> tuple[int, int]:
    """'WIDTHxHEIGHT' (or (width, height)) -> (width, height): both multiples of 16 within the limits."""
    if isinstance(size, str):
        width_text, sep, height_text = size.partition("x")
        if not sep or not width_text.isdigit() or not height_text.isdigit():
            raise InvalidRequest(f"size must be WIDTHxHEIGHT (e.g. 1024x1024) or auto, got {size!r}", "size")
        width, height = int(width_text), int(height_text)
    else:
        width, height = (int(v) for v in size)
        size = f"{width}x{height}"
    for side in (width, height):
        if side % SIZE_STRIDE or not limits.min_side <= side <= limits.max_side:
            raise InvalidRequest(
                f"size {size}: each side must be a multiple of {SIZE_STRIDE} in [{limits.min_side}, {limits.max_side}]",
                "size",
            )
    return width, height


def _pick(value: Any, default: Any) -> Any:
    return default if value is None else value


def _check_range(name: str, value: float | None, lo: float, hi: float) -> None:
    if value is not None and not (math.isfinite(value) and lo <= value <= hi):
        raise InvalidRequest(f"{name} must be in [{lo:g}, {hi:g}], got {value}", name)


def _check_interval(interval: tuple[float, float] | None) -> None:
    if interval is None:
        return
    lo, hi = interval
    if not (math.isfinite(lo) and math.isfinite(hi) and 0.0 <= lo <= hi <= 1.0):
        raise InvalidRequest(f"cfg_interval must be [start, end] with 0 <= start <= end <= 1, got {list(interval)}",
                             "cfg_interval")
