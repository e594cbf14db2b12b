"""Native inputs -> RequestSpec values: arrays from base64, media decoded, plain JSON passed through."""

from __future__ import annotations

from typing import Any

from walkserve.api.errors import bad_request
from walkserve.api.media.data_url import decode_base64
from walkserve.api.schemas.generate import ArrayInput, AudioInput, ImageInput, VideoInput
from walkserve.api.state import AppState
from walkserve.core.array import ArrayData


def decode_array(value: ArrayInput, param: str) -> ArrayData:
    data = decode_base64(value.data, f"{param}.data")
    try:
        return ArrayData(value.dtype, tuple(value.shape), data)
    except ValueError as e:
        raise bad_request(str(e), param, "invalid_array") from None


def _image_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, ImageInput) for v in value)


async def convert_inputs(state: AppState, inputs: dict[str, Any]) -> dict[str, Any]:
    """Each input decoded; a list of image parts (counted as one media part, like a frames URL) is a list of
    uint8 [H, W, 3] arrays, which the processor stacks or reads one by one."""
    media = sum(isinstance(v, (ImageInput, AudioInput, VideoInput)) or _image_list(v) for v in inputs.values())
    state.media.check_count(media, "inputs")
    out: dict[str, Any] = {}
    for name, value in inputs.items():
        param = f"inputs.{name}"
        if _image_list(value):
            state.require("image_in", "image inputs", param)
            out[name] = [await state.media.image_from_url(v.url, f"{param}[{i}].url") for i, v in enumerate(value)]
        elif isinstance(value, ArrayInput):
            out[name] = decode_array(value, param)
        elif isinstance(value, ImageInput):
            state.require("image_in", "image inputs", param)
            out[name] = await state.media.image_from_url(value.url, f"{param}.url")
        elif isinstance(value, AudioInput):
            state.require("audio_in", "audio inputs", param)
            audio, rate = await state.media.audio_from_url(value.url, f"{param}.url")
            out[name] = audio
            out[f"{name}_sample_rate"] = rate
        elif isinstance(value, VideoInput):
            out[name] = await video_value(state, value, param)
        else:
            out[name] = value
    return out


async def video_value(state: AppState, value: VideoInput, param: str) -> ArrayData | bytes:
    """A video input: its frames as one uint8 [T, H, W, 3] array, or a video file's bytes (the model decodes them)."""
    state.require("video_in", "video inputs", param)
    video = await state.media.video_from_url(value.url, f"{param}.url")
    if "video" in video:
        return video["video"]
    frames = video["frames"]
    if any(f.shape != frames[0].shape for f in frames):
        raise bad_request(f"the frames of {param} differ in size ({frames[0].shape} and others)", f"{param}.url",
                          "invalid_video")
    return ArrayData("uint8", (len(frames), *frames[0].shape), b"".join(f.data for f in frames))
