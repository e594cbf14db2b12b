"""The V-JEPA 2 frontend (torch-free): HTTP payloads -> RequestSpec for the tasks encode, predict, rollout, plan.

    encode     inputs.video | inputs.frames: uint8 [T, H, W, 3] (a frames URL, a list of image parts of one size,
               a video file, or an array), or one image [H, W, 3]; streamed one clip of ``clip_frames`` frames
               at a time
    embedding  the same, pooled (mean over tokens) per clip: the /v1/embeddings route
    predict    inputs.video | inputs.frames as encode, one clip (T <= frames_per_clip) at crop_size²;
               inputs.target_ids [Nt] and inputs.context_ids [Nc] (default: every other token), raster
               token indices t * grid² + row * grid + col of the encoder's output (an HF checkpoint's
               masked predictor)
    rollout    inputs.frames [C, H, W, 3] (the context frames), inputs.actions [C+H-1, 7],
               inputs.states [C, 7] (or every step's, [C+H-1, 7]); params.horizon H
    plan       inputs.frames [C, H, W, 3], inputs.goal (an image), inputs.states [C, 7],
               inputs.actions [C-1, 7] when C >= 2; params.horizon and the CEM parameters

Every check is ``validate.py``'s: a bad field is an InvalidRequest (HTTP 400) naming it. Params that
the walks read and the client does not set (``context_frames``, ``clips``) are filled here.
"""

from __future__ import annotations

import math
from array import array
from typing import Any

import numpy as np

from walkserve.core.array import ArrayData
from walkserve.core.errors import InvalidRequest
from walkserve.core.request import RequestSpec
from walkserve.core.sampling import SamplingParams
from walkserve.models.processor import ModelCard, Processor, list_to_array
from walkserve.models.vjepa2.config import VJEPA2ACConfig, VJEPA2Config
from walkserve.models.vjepa2.graph import ENCODE, PLAN, PREDICT, ROLLOUT
from walkserve.models.vjepa2.params import VJEPA2Params, derived_run
from walkserve.models.vjepa2.validate import (
    FLOAT_DTYPES,
    array_spec,
    check_frames,
    check_plan,
    check_rollout,
    check_square,
    check_token_ids,
    check_vectors,
)
from walkserve.models.vjepa2.video_file import decode_video_file

EMBEDDING = "embedding"
TASK_INPUTS = {  # what each task reads; another input is a 400 naming it (a misspelt one is not silently dropped)
    ENCODE: ("video", "frames"), EMBEDDING: ("video", "frames"), PREDICT: ("video", "frames", "context_ids", "target_ids"),
    ROLLOUT: ("frames", "actions", "states"), PLAN: ("frames", "goal", "states", "actions"),
}
class VJEPA2Processor(Processor):
    params_type = VJEPA2Params

    def __init__(self, config: VJEPA2Config | VJEPA2ACConfig, model_id: str, predict: bool = False):
        self.config = config
        self.ac = isinstance(config, VJEPA2ACConfig)
        self.predict = predict and not self.ac
        caps = {"encode", "embeddings", "image_in", "video_in"} | ({"rollout", "plan"} if self.ac else set())
        caps |= {"predict"} if self.predict else set()
        self._card = ModelCard(id=model_id, family="vjepa2", capabilities=frozenset(caps),
                               random_weights=config.random_weights, unsupported=self._unsupported(),
                               description="V-JEPA 2-AC world model" if self.ac else "V-JEPA 2 video encoder")

    def _unsupported(self) -> dict[str, str]:
        """Why a task is missing, for its 400."""
        out = {} if self.ac else {t: "it needs a V-JEPA 2-AC checkpoint; this one is an encoder only"
                                  for t in (ROLLOUT, PLAN)}
        if not self.predict:
            out[PREDICT] = ("a V-JEPA 2-AC checkpoint has no masked predictor (serve an HF V-JEPA 2 checkpoint)"
                            if self.ac else "this checkpoint has no masked predictor (no predictor.* tensors), "
                            "or the placement does not place it")
        return out

    def card(self) -> ModelCard:
        return self._card

    def build_request(self, task: str, payload: dict[str, Any], sampling: SamplingParams,
                      params: VJEPA2Params) -> RequestSpec:
        inputs = payload.get("inputs", payload)
        unknown = sorted(set(inputs) - set(TASK_INPUTS.get(task, inputs)))
        if unknown:
            raise InvalidRequest(f"unknown input {unknown[0]!r}; the {task} task takes {', '.join(TASK_INPUTS[task])}",
                                 param=unknown[0])
        if task in (ENCODE, EMBEDDING):
            return self._encode(inputs, params, pool=task == EMBEDDING)
        if task in self._card.unsupported:
            raise InvalidRequest(f"task {task!r}: {self._card.unsupported[task]}", param="task")
        if task == PREDICT:
            return self._predict(inputs, params)
        if task == ROLLOUT:
            return self._rollout(inputs, params)
        if task == PLAN:
            return self._plan(inputs, params)
        raise InvalidRequest(f"V-JEPA 2 takes the tasks encode, predict, rollout and plan, not {task!r}", param="task")

    # ---- tasks ----------------------------------------------------------------------------------
    def _encode(self, inputs: dict[str, Any], params: VJEPA2Params, pool: bool) -> RequestSpec:
        name = "video" if "video" in inputs else "frames"
        video = _frames(inputs, name, image_ok=True)
        e = self.config.encoder
        t, h, w = check_frames(name, *array_spec(video, name), tubelet=e.tubelet_size)
        if not params.resize and (h % e.patch_size or w % e.patch_size):
            raise InvalidRequest(f"{name}: {h}x{w} is not whole {e.patch_size}-pixel patches (resize is false)",
                                 param=name)
        clip = params.clip_frames or e.frames_per_clip
        if clip % e.tubelet_size:
            raise InvalidRequest(f"clip_frames {clip} is not a multiple of the tubelet size {e.tubelet_size}",
                                 param="clip_frames")
        run = derived_run(params, clips=math.ceil(t / clip), clip_frames=clip, pool=pool)
        return RequestSpec({"video": video}, task=ENCODE, modalities=("latent",), params=run)

    def _predict(self, inputs: dict[str, Any], params: VJEPA2Params) -> RequestSpec:
        """One clip at crop_size² (the grid the masked predictor's positions assume) and its token masks."""
        name = "video" if "video" in inputs else "frames"
        video = _frames(inputs, name, image_ok=True)
        e = self.config.encoder
        t, h, w = check_frames(name, *array_spec(video, name), tubelet=e.tubelet_size)
        if t > e.frames_per_clip:
            raise InvalidRequest(f"{name}: {t} frames; predict takes one clip of at most {e.frames_per_clip} "
                                 f"(the checkpoint's frames_per_clip)", param=name)
        if not params.resize:
            check_square(h, w, name, crop=e.crop_size)
        tokens = e.tokens(max(t, e.tubelet_size), e.crop_size, e.crop_size)  # an image is one tubelet
        target = _token_ids(inputs, "target_ids", tokens)
        if inputs.get("context_ids") is None:
            context = sorted(set(range(tokens)) - set(target))
            if not context:
                raise InvalidRequest(f"target_ids covers all {tokens} tokens: no context is left", param="target_ids")
        else:
            context = _token_ids(inputs, "context_ids", tokens)
            shared = set(context) & set(target)
            if shared:
                raise InvalidRequest(f"context_ids and target_ids share token index {min(shared)}",
                                     param="context_ids")
        x = {"video": video, "context_ids": ArrayData.from_list(context), "target_ids": ArrayData.from_list(target)}
        return RequestSpec(x, task=PREDICT, modalities=("latent",), params=derived_run(params))

    def _rollout(self, inputs: dict[str, Any], params: VJEPA2Params) -> RequestSpec:
        frames = self._ac_frames(inputs, "frames", params)
        c = frames.shape[0]
        actions, states = _vectors(inputs, "actions"), _vectors(inputs, "states")
        check_rollout(c, params.horizon, array_spec(actions, "actions"), array_spec(states, "states"),
                      self.config.predictor.max_steps)
        return RequestSpec({"frames": frames, "actions": actions, "states": states}, task=ROLLOUT,
                           modalities=("latent",), params=derived_run(params, context_frames=c))

    def _plan(self, inputs: dict[str, Any], params: VJEPA2Params) -> RequestSpec:
        frames = self._ac_frames(inputs, "frames", params)
        goal = self._ac_frames(inputs, "goal", params)
        c = frames.shape[0]
        if goal.shape[0] != 1:
            raise InvalidRequest(f"goal must be one image, got {goal.shape[0]} frames", param="goal")
        check_plan(params.samples, params.topk, params.iterations, params.horizon or 2, c,
                   self.config.predictor.max_steps)
        states = _vectors(inputs, "states")
        check_vectors("states", *array_spec(states, "states"), rows=c)
        x = {"frames": frames, "goal": goal, "states": states}
        if c > 1:
            x["actions"] = _vectors(inputs, "actions")
            check_vectors("actions", *array_spec(x["actions"], "actions"), rows=c - 1)
        run = derived_run(params, horizon=params.horizon or 2, context_frames=c)
        return RequestSpec(x, task=PLAN, modalities=("latent", "action"), params=run)

    def _ac_frames(self, inputs: dict[str, Any], name: str, params: VJEPA2Params) -> ArrayData:
        """Frames for the AC encoder: each frame alone, so any count; exactly crop² when not resized."""
        frames = _frames(inputs, name, image_ok=True)
        _, h, w = check_frames(name, *array_spec(frames, name), tubelet=1)
        if not params.resize:
            check_square(h, w, name, crop=self.config.encoder.crop_size)
        return frames


def _frames(inputs: dict[str, Any], name: str, image_ok: bool) -> ArrayData:
    """An image [H, W, 3] or frames [T, H, W, 3] as an ArrayData; a missing or non-array input is a 400."""
    value = inputs.get(name)
    if value is None:
        raise InvalidRequest(f"inputs.{name} is required", param=name)
    if isinstance(value, list):
        value = stack_images(value, name) if value and isinstance(value[0], ArrayData) else list_to_array(value, name)
    if isinstance(value, bytes):  # a video file (the native route's video input)
        value = decode_video_file(value, name)
    if not isinstance(value, ArrayData):
        raise InvalidRequest(f"{name} must be images, a video or an array, got {type(value).__name__}", param=name)
    if image_ok and len(value.shape) == 3:
        value = ArrayData(value.dtype, (1, *value.shape), value.data)
    return value


def stack_images(images: list[Any], name: str) -> ArrayData:
    """Image parts [H, W, 3] (a list, as the native route decodes one) -> frames [T, H, W, 3]; all of one size."""
    first = images[0]
    for i, image in enumerate(images):
        if not isinstance(image, ArrayData) or image.dtype != "uint8" or len(image.shape) != 3:
            raise InvalidRequest(f"{name}[{i}] must be an image part", param=f"{name}[{i}]")
        if image.shape != first.shape:
            raise InvalidRequest(f"{name}[{i}] is {image.shape[1]}x{image.shape[0]} but {name}[0] is "
                                 f"{first.shape[1]}x{first.shape[0]} (WIDTHxHEIGHT): the frames must share one size",
                                 param=f"{name}[{i}]")
    return ArrayData("uint8", (len(images), *first.shape), b"".join(image.data for image in images))


def _token_ids(inputs: dict[str, Any], name: str, tokens: int) -> list[int]:
    """context_ids / target_ids: a list or an integer array of raster token indices, checked."""
    value = inputs.get(name)
    if value is None:
        raise InvalidRequest(f"inputs.{name} is required", param=name)
    if isinstance(value, list):
        value = list_to_array(value, name) if value else ArrayData("int64", (0,), b"")
    if not isinstance(value, ArrayData):
        raise InvalidRequest(f"{name} must be a list of token indices, got {type(value).__name__}", param=name)
    values = value.tolist() if value.dtype in ("int64", "int32") else []
    return check_token_ids(name, value.dtype, values, value.shape, tokens)


def _vectors(inputs: dict[str, Any], name: str) -> ArrayData:
    """actions / states: an array or nested lists, as a float ArrayData (its shape is checked by the caller)."""
    value = inputs.get(name)
    if value is None:
        raise InvalidRequest(f"inputs.{name} is required", param=name)
    if isinstance(value, list):
        value = list_to_array(value, name)
        if value.dtype == "int64":  # whole numbers written without a decimal point
            value = ArrayData("float32", value.shape, array("f", array("q", value.data)).tobytes())
    if not isinstance(value, ArrayData):
        raise InvalidRequest(f"{name} must be a [T, 7] float array, got {type(value).__name__}", param=name)
    if value.dtype not in FLOAT_DTYPES:
        raise InvalidRequest(f"{name} must be a float array ({', '.join(FLOAT_DTYPES)}), got {value.dtype}", param=name)
    if not np.isfinite(_floats(value)).all():  # a NaN would come back as a rollout of NaNs
        raise InvalidRequest(f"{name} must hold finite numbers", param=name, code="invalid_input")
    return value


def _floats(value: ArrayData) -> np.ndarray:
    """A float ArrayData's values (bfloat16: the upper half of a float32's bits)."""
    if value.dtype == "bfloat16":
        return (np.frombuffer(value.data, np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.frombuffer(value.data, np.dtype(value.dtype))
