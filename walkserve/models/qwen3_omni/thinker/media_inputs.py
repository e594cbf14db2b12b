"""Decoded media parts of a request -> what the thinker's processor takes (torch-free; the API process).

The API hands the processor chat messages whose content parts are already
decoded under its caps (``walkserve/api/openai/chat_input.py``):

    {"type": "text", "text": str}
    {"type": "image", "image": uint8 [H, W, 3]}
    {"type": "audio", "audio": float32 [N], "sample_rate": int}
    {"type": "video", "video": bytes of a video file}  or  {"type": "video", "frames": [uint8 [H, W, 3]], "fps": float}

Each becomes the encoder input the checkpoint's processor would make (audio
resampled to 16 kHz, mel features per clip, as the processor computes a clip
given alone; images smart-resized, bicubic, normalised; videos sampled at 2 fps),
in order of appearance per kind. Anything the model cannot take is an
``InvalidRequest`` naming the part (``messages[i].content[j]``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from walkserve.core.array import ArrayData
from walkserve.core.errors import InvalidRequest
from walkserve.models.qwen3_omni.thinker.audio_features import SAMPLE_RATE
from walkserve.models.qwen3_omni.thinker.audio_load import ResampleCache
from walkserve.models.qwen3_omni.thinker.image_processor import (
    VisionInput,
    VisionPreprocess,
    preprocess_image,
)
from walkserve.models.qwen3_omni.thinker.mel_cache import MelCache
from walkserve.models.qwen3_omni.thinker.video import (
    DEFAULT_FPS,
    MAX_FRAMES,
    VideoInput,
    decode_video,
    video_from_frames,
)

MAX_VIDEO_SECONDS = 600.0  # one input video; longer is a 400 naming the part
KINDS = ("text", "image", "audio", "video")


@dataclass(frozen=True)
class MediaSettings:
    """How media become encoder inputs: the checkpoint's image and video bounds, and which encoders exist."""

    image: VisionPreprocess
    video: VisionPreprocess
    has_audio: bool = True
    has_vision: bool = True
    n_mels: int = 128
    max_video_seconds: float = MAX_VIDEO_SECONDS
    resampler: ResampleCache = field(default_factory=ResampleCache, compare=False)  # audio that grows as it arrives
    mel: MelCache = field(default_factory=MelCache, compare=False)


@dataclass
class MediaInputs:
    """Encoder inputs in prompt order per kind, and the messages as the chat template takes them."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    audio: list[np.ndarray] = field(default_factory=list)  # mel float32 [n_mels, F] per clip
    images: list[VisionInput] = field(default_factory=list)
    videos: list[VideoInput] = field(default_factory=list)

    @property
    def any(self) -> bool:
        return bool(self.audio or self.images or self.videos)


def convert_messages(messages: Any, settings: MediaSettings) -> MediaInputs:
    """Chat messages (content a string or parts) -> template messages and encoder inputs."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages must be a non-empty list", param="messages")
    out, waves = MediaInputs(), []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise InvalidRequest(f"messages[{i}] must be an object with a string role", param=f"messages[{i}]")
        content = message.get("content")
        if content is None or isinstance(content, str):
            out.messages.append({**message, "content": content or ""})
            continue
        if not isinstance(content, list):
            raise InvalidRequest(f"messages[{i}].content must be a string or a list of parts", param=f"messages[{i}].content")
        parts = []
        for j, part in enumerate(content):
            param = f"messages[{i}].content[{j}]"
            parts.append(_part(part, param, settings, out, waves))
        out.messages.append({**message, "content": parts})
    out.audio = mel_features(waves, settings.n_mels, settings.mel)
    return out


def media_from_inputs(named: Mapping[str, Any], settings: MediaSettings) -> tuple[list[dict[str, Any]], MediaInputs]:
    """/v1/generate: media inputs named ``image*``, ``audio*``, ``video*`` (in the order given) -> parts + inputs."""
    out, waves, parts = MediaInputs(), [], []
    for name, value in named.items():
        kind = next((k for k in ("image", "audio", "video") if name.startswith(k)), None)
        if kind is None or name.endswith("_sample_rate") or name.endswith("_fps"):
            continue
        part: dict[str, Any] = {"type": kind}
        if kind == "audio":
            part.update(audio=value, sample_rate=named.get(f"{name}_sample_rate", SAMPLE_RATE))
        elif kind == "video" and isinstance(value, ArrayData):
            part.update(frames=_frames_array(value, f"inputs.{name}"), fps=named.get(f"{name}_fps", DEFAULT_FPS))
        else:
            part[kind] = value
        parts.append(_part(part, f"inputs.{name}", settings, out, waves))
    out.audio = mel_features(waves, settings.n_mels, settings.mel)
    return parts, out


def mel_features(waves: Sequence[np.ndarray], n_mels: int, cache: MelCache | None = None) -> list[np.ndarray]:
    """Log-mel of each clip on its own (``audio_features.log_mel_clip``): a clip's features, and so its
    content keys, do not depend on the other clips of the request. ``cache`` keeps the frames of recent clips
    (a clip resent longer computes only its new frames)."""
    return [(cache or MelCache(0)).features(w, n_mels) for w in waves]


def _part(part: Any, param: str, settings: MediaSettings, out: MediaInputs, waves: list) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, Mapping) else None
    if kind not in KINDS:
        raise InvalidRequest(f"content part type {kind!r} is not supported (text, image_url, input_audio, video_url)",
                             param=param)
    if kind == "text":
        if not isinstance(part.get("text"), str):
            raise InvalidRequest("a text part needs a string text", param=param)
        return {"type": "text", "text": part["text"]}
    if kind == "audio" and not settings.has_audio:
        raise InvalidRequest("this checkpoint has no audio encoder: audio inputs are not supported", param=param)
    if kind in ("image", "video") and not settings.has_vision:
        raise InvalidRequest(f"this checkpoint has no vision encoder: {kind} inputs are not supported", param=param)
    try:
        if kind == "audio":
            waves.append(_wave(part, param, settings.resampler))
        elif kind == "image":
            out.images.append(preprocess_image(_pixels(part.get("image"), param), settings.image))
        else:
            out.videos.append(_video(part, param, settings))
    except ValueError as e:  # VideoDecodeError too: undecodable, too long, a bad size
        raise InvalidRequest(f"{kind}: {e}", param=param) from None
    return {"type": kind}


def _wave(part: Mapping[str, Any], param: str, resampler: ResampleCache) -> np.ndarray:
    value, rate = part.get("audio"), part.get("sample_rate")
    if not isinstance(value, ArrayData) or len(value.shape) != 1 or value.dtype != "float32":
        raise InvalidRequest("audio must be mono float32 samples", param=param)
    if not isinstance(rate, int) or isinstance(rate, bool) or rate <= 0:
        raise InvalidRequest(f"audio sample rate must be a positive integer, got {rate!r}", param=param)
    wave = resampler.resample(np.frombuffer(value.data, dtype=np.float32), rate, SAMPLE_RATE)
    if wave.shape[0] <= 200:
        raise InvalidRequest("the audio is too short (at least 12.5 ms)", param=param)
    return wave


def _pixels(value: Any, param: str) -> np.ndarray:
    if not isinstance(value, ArrayData) or value.dtype != "uint8" or len(value.shape) != 3 or value.shape[2] != 3:
        raise InvalidRequest("an image must be RGB uint8 [H, W, 3]", param=param)
    return np.frombuffer(value.data, dtype=np.uint8).reshape(value.shape)


def _frames_array(value: ArrayData, param: str) -> list[ArrayData]:
    """uint8 [T, H, W, 3] -> T frames."""
    if value.dtype != "uint8" or len(value.shape) != 4 or value.shape[3] != 3:
        raise InvalidRequest("video frames must be uint8 [T, H, W, 3]", param=param)
    return ArrayData.rows(value.dtype, tuple(value.shape), value.data)


def _video(part: Mapping[str, Any], param: str, settings: MediaSettings) -> VideoInput:
    if part.get("frames") is not None:
        frames = [_pixels(f, param) for f in part["frames"]]
        if len(frames) > MAX_FRAMES:
            raise InvalidRequest(f"the video has {len(frames)} frames; the limit is {MAX_FRAMES}", param=param)
        fps = part.get("fps") or DEFAULT_FPS
        if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not 0 < fps <= 240:
            raise InvalidRequest(f"video fps must be in (0, 240], got {fps!r}", param=param)
        return video_from_frames(frames, float(fps), settings.video)
    data = part.get("video")
    if not isinstance(data, (bytes, bytearray)):
        raise InvalidRequest("a video part needs a video file or frames", param=param)
    return decode_video(bytes(data), settings.video, max_seconds=settings.max_video_seconds)
