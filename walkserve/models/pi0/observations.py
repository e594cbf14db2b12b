"""openpi's example observations -> this family's inputs (torch-free).

openpi's robot-side examples send a flat dict through ``WebsocketClientPolicy.infer``;
openpi's server maps it with a per-robot transform (``DroidInputs``,
``LiberoInputs``). The same mappings, onto the camera names of lerobot's
checkpoints:

    DROID   observation/exterior_image_1_left  -> base_0_rgb
            observation/wrist_image_left       -> left_wrist_0_rgb
            (right_wrist_0_rgb absent: masked, as openpi does)
            observation/joint_position [7] + observation/gripper_position [1] -> state [8]
    LIBERO  observation/image                  -> base_0_rgb
            observation/wrist_image            -> left_wrist_0_rgb
            observation/state [8]              -> state
    both    prompt                             -> prompt

Keys already in this family's names (``base_0_rgb``, ``state``, ``prompt``,
``noise`` ...) pass through, so a client may also send them directly. Other
keys are ignored, as openpi's transforms ignore them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from walkserve.core.errors import InvalidRequest

DROID_IMAGES = {"observation/exterior_image_1_left": "base_0_rgb", "observation/wrist_image_left": "left_wrist_0_rgb"}
DROID_JOINTS, DROID_GRIPPER = "observation/joint_position", "observation/gripper_position"
LIBERO_IMAGES = {"observation/image": "base_0_rgb", "observation/wrist_image": "left_wrist_0_rgb"}
LIBERO_STATE = "observation/state"
NATIVE = ("state", "prompt", "noise")


def observation_layout(observation: Mapping[str, Any]) -> str:
    """``droid``, ``libero`` or ``native`` (this family's own input names)."""
    if DROID_JOINTS in observation or any(k in observation for k in DROID_IMAGES):
        return "droid"
    if LIBERO_STATE in observation or any(k in observation for k in LIBERO_IMAGES):
        return "libero"
    return "native"


def map_observation(observation: Mapping[str, Any], cameras: tuple[str, ...]) -> dict[str, Any]:
    """An openpi observation dict -> the flat inputs ``inputs.validate_inputs`` checks.

    Raises InvalidRequest naming the observation key for a DROID state part that is missing or not a vector.
    """
    layout = observation_layout(observation)
    out: dict[str, Any] = {k: v for k, v in observation.items() if k in cameras or k in NATIVE}
    if isinstance(out.get("prompt"), bytes):
        out["prompt"] = out["prompt"].decode("utf-8", errors="replace")
    if layout == "droid":
        out |= {ours: observation[theirs] for theirs, ours in DROID_IMAGES.items() if theirs in observation}
        out["state"] = np.concatenate([_vector(observation, DROID_JOINTS), _vector(observation, DROID_GRIPPER)])
    elif layout == "libero":
        out |= {ours: observation[theirs] for theirs, ours in LIBERO_IMAGES.items() if theirs in observation}
        if LIBERO_STATE in observation:
            out["state"] = observation[LIBERO_STATE]
    return out


def _vector(observation: Mapping[str, Any], key: str) -> np.ndarray:
    if key not in observation:
        raise InvalidRequest("is required by the DROID observation layout", param=key, code="missing_input")
    try:
        value = np.asarray(observation[key], dtype=np.float32)
    except (TypeError, ValueError):
        raise InvalidRequest("must be a numeric array", param=key, code="invalid_input") from None
    if value.ndim > 1:
        raise InvalidRequest(f"must be a vector, got {list(value.shape)}", param=key, code="invalid_shape")
    return value.reshape(-1)  # a scalar gripper position becomes [1], as openpi's DroidInputs does
