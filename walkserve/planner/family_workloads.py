"""Each family's default workload for ``walkserve plan`` and ``--placement auto``: what its card serves, in a mix.

    orpheus      speech of 64 tokens
    qwen3-omni   60 % spoken answers (16 frames), 40 % text answers
    bagel        60 % text-to-image, 25 % understanding of an image, 15 % edits
    pi0, pi05    action chunks from two cameras, a state and a prompt
    vjepa2       70 % rollouts of 4 steps from one frame (with the AC predictor), 30 % encodes of a 16-frame clip
    others       text completions of 32 tokens

Media are small synthetic pictures (a gradient with the request's stripe): the processor resizes them to the
model's input size, so their cost in the profile is the model's, not the picture's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from walkserve.core.array import ArrayData
from walkserve.planner.workload import RequestKind, Workload


def picture(height: int = 64, width: int = 64, shade: int = 0) -> ArrayData:
    """uint8 [H, W, 3]: a colour gradient, ``shade`` shifting it (distinct inputs for distinct requests)."""
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([(x * 255) // max(width - 1, 1), (y * 255) // max(height - 1, 1), (x + y + shade) % 256], -1)
    return ArrayData("uint8", (height, width, 3), rgb.astype(np.uint8).tobytes())


def clip(frames: int, height: int = 64, width: int = 64) -> ArrayData:
    """uint8 [T, H, W, 3]: ``frames`` pictures, each shaded by its index."""
    data = b"".join(picture(height, width, 16 * t).data for t in range(frames))
    return ArrayData("uint8", (frames, height, width, 3), data)


def floats(values: np.ndarray) -> ArrayData:
    values = np.ascontiguousarray(values, dtype=np.float32)
    return ArrayData("float32", tuple(values.shape), values.tobytes())


def chat(text: str, audio: bool) -> dict[str, Any]:
    """A one-message chat payload, answered in text (and speech with ``audio``)."""
    return {"messages": [{"role": "user", "content": text}], "modalities": ["text", "audio"] if audio else ["text"]}


def _robot() -> dict[str, Any]:
    state = floats(np.linspace(-0.5, 0.5, 8))
    return {"inputs": {"base_0_rgb": picture(), "left_wrist_0_rgb": picture(shade=96), "state": state,
                       "prompt": "pick up cup {i}"}}


def _rollout(horizon: int) -> dict[str, Any]:
    actions = np.concatenate([np.full((horizon, 6), 0.02), np.zeros((horizon, 1))], 1)  # [H, 7]: one context frame
    return {"inputs": {"frames": clip(1), "actions": floats(actions), "states": floats(np.zeros((1, 7)))}}


def _defaults() -> dict[str, Workload]:
    image = picture(shade=48)
    robot = Workload((RequestKind("act", 1.0, "act", _robot(), 1),), 4)
    return {
        "orpheus": Workload((RequestKind("speech", 1.0, "speech", {"input": "Hello number {i}, how are you today?"}, 64),), 4),
        "qwen3-omni": Workload((
            RequestKind("spoken", 0.6, "chat", chat("Tell me about the number {i} in a few words.", True), 16,
                        {"max_audio_frames": 16}),
            RequestKind("text", 0.4, "chat", chat("Say something about {i}.", False), 32),
        ), 4),
        "bagel": Workload((
            RequestKind("generate", 0.6, "image", {"prompt": "A lighthouse at dawn, number {i}."}, 1),
            RequestKind("understand", 0.25, "chat", {"messages": [{"role": "user", "content": [
                {"type": "image", "image": image}, {"type": "text", "text": "What is in picture {i}?"}]}]}, 32),
            RequestKind("edit", 0.15, "image", {"prompt": "Make picture {i} warmer.", "image": image}, 1),
        ), 4),
        "pi0": robot,
        "pi05": robot,
        "vjepa2": Workload((
            RequestKind("rollout", 0.7, "rollout", _rollout(4), 1, {"horizon": 4}),
            RequestKind("encode", 0.3, "encode", {"inputs": {"video": clip(16)}}, 1),
        ), 4),
    }


def family_default(family: str) -> Workload:
    """The family's default mix; a family without one gets a text completion of 32 tokens."""
    found = _defaults().get(family)
    if found is not None:
        return found
    return Workload((RequestKind("text", 1.0, "completion", {"prompt": "Count to {i}:"}, 32),), 4)
