"""V-JEPA 2's typed request params: what a client sets (``VJEPA2Params``) and what a request carries past the
processor (``VJEPA2Run``: the same, resolved, plus what the processor derived from the inputs). Torch-free."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from walkserve.core.params import Params

Count = Annotated[int, Meta(ge=1)]
Real = Annotated[float, Meta(ge=0.0)]


class VJEPA2Params(Params, frozen=True, tag="vjepa2"):
    """Request parameters; the CEM defaults are the released planner's (``cem.CEMConfig``)."""

    horizon: int | None = None
    dtype: Literal["float32", "float16", "bfloat16"] = "float32"  # of the features sent back
    resize: bool = True  # False: frames are used as given (encode: any size of whole patches; AC: exactly crop²)
    clip_frames: Count | None = None  # encode: frames per clip (default: the checkpoint's frames_per_clip)
    samples: Count = 400
    topk: Count = 10
    iterations: Count = 10
    momentum_mean: Real = 0.15
    momentum_std: Real = 0.15
    momentum_mean_gripper: Real = 0.15
    momentum_std_gripper: Real = 0.15
    maxnorm: Real = 0.05
    gripper_max: Real = 0.75
    gripper_round: Real = 0.25
    seed: int = 0
    return_features: bool = False


class VJEPA2Run(VJEPA2Params, frozen=True, tag="vjepa2.run"):
    """What a V-JEPA 2 request carries past its processor: the checked params, ``clip_frames`` and ``horizon``
    resolved, and what the processor derived from the inputs (never set by a client)."""

    clips: int = 1  # encode: clips of ``clip_frames`` the video is cut into
    pool: bool = False  # embedding: the clip features mean-pooled
    context_frames: int = 0  # rollout and plan: the frames given as context


def run_params(params: Params) -> VJEPA2Run:
    """An item's params as a ``VJEPA2Run`` (the defaults for a direct call that gives none)."""
    return params if isinstance(params, VJEPA2Run) else VJEPA2Run()


def derived_run(params: VJEPA2Params, **derived: Any) -> VJEPA2Run:
    return VJEPA2Run(**{**msgspec.structs.asdict(params), **derived})
