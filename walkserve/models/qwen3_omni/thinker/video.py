"""Videos for the thinker: frames given as arrays, or decoded from a file with PyAV (the optional ``av`` package).

Frames are sampled as the Qwen-Omni utilities do: ``fps`` (2 by default)
frames per second of video, rounded to a multiple of the temporal patch (2),
at least ``min_frames`` and at most ``max_frames``, evenly spaced. The
thinker's temporal positions then advance by ``second_per_grid x
position_id_per_seconds`` per group of 2 frames, ``second_per_grid =
temporal_patch_size / fps`` of the sampled frames.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from walkserve.models.qwen3_omni.thinker.image_processor import (
    VisionInput,
    VisionPreprocess,
    preprocess_video,
)

DEFAULT_FPS = 2.0
MIN_FRAMES = 4
MAX_FRAMES = 768


class VideoDecodeError(ValueError):
    """The bytes are not a video PyAV can decode (or PyAV is not installed)."""


@dataclass(frozen=True)
class VideoInput:
    """A preprocessed video: the encoder input and the time one temporal group spans."""

    vision: VisionInput
    second_per_grid: float


def video_from_frames(frames: Sequence[np.ndarray], fps: float, settings: VisionPreprocess) -> VideoInput:
    """Frames already sampled (uint8 [H, W, 3] each) at ``fps`` frames per second."""
    if not fps > 0:
        raise ValueError(f"fps must be > 0, got {fps}")
    return VideoInput(preprocess_video(frames, settings), settings.temporal_patch_size / fps)


def sample_indices(total: int, video_fps: float, fps: float = DEFAULT_FPS, factor: int = 2,
                   min_frames: int = MIN_FRAMES, max_frames: int = MAX_FRAMES) -> np.ndarray:
    """Which of ``total`` decoded frames to keep: about ``fps`` per second, a multiple of ``factor``."""
    if total <= 0:
        raise ValueError("the video has no frames")
    wanted = total / video_fps * fps
    lo = -(-min_frames // factor) * factor
    hi = max(factor, min(max_frames, total) // factor * factor)
    n = int(min(max(round(wanted / factor) * factor, lo), hi))
    n = max(factor, n)
    return np.linspace(0, total - 1, n).round().astype(np.int64)


def decode_video(data: bytes, settings: VisionPreprocess, fps: float = DEFAULT_FPS,
                 max_frames: int = MAX_FRAMES, max_seconds: float | None = None) -> VideoInput:
    """Decode a video file (any container FFmpeg reads: mp4, webm, mkv, mov, ...) and sample its frames.

    When the container states its frame count, only the sampled frames are
    kept while decoding (memory stays at the sampled frames, not the whole video).
    """
    frames, total, video_fps = _decode_frames(data, max_seconds, fps, settings.temporal_patch_size, max_frames)
    index = sample_indices(total, video_fps, fps, settings.temporal_patch_size, max_frames=max_frames)
    sampled_fps = len(index) / total * video_fps
    return video_from_frames([frames[int(i)] for i in index], sampled_fps, settings)


def _decode_frames(data: bytes, max_seconds: float | None, fps: float, factor: int,
                   max_frames: int) -> tuple[dict[int, np.ndarray], int, float]:
    """{frame index: RGB uint8 [H, W, 3]} of the frames sampling will take, the frame count and the video's fps."""
    try:
        import av
    except ImportError:
        raise VideoDecodeError("decoding video files needs the optional 'av' package (pip install av)") from None
    try:
        with av.open(io.BytesIO(data)) as container:
            stream = container.streams.video[0]
            rate = float(stream.average_rate or stream.guessed_rate or 0) or 25.0
            if max_seconds is not None and stream.frames and stream.frames > max_seconds * rate + 1:
                raise VideoDecodeError(f"the video is longer than {max_seconds:g} s")
            wanted = set(sample_indices(stream.frames, rate, fps, factor, max_frames=max_frames).tolist()) \
                if stream.frames else None
            frames, n = {}, 0
            for frame in container.decode(stream):
                if wanted is None or n in wanted:
                    frames[n] = frame.to_ndarray(format="rgb24")  # [H, W, 3] uint8
                n += 1
                if max_seconds is not None and n > max_seconds * rate + 1:
                    raise VideoDecodeError(f"the video is longer than {max_seconds:g} s")
    except (av.error.FFmpegError, IndexError, ValueError) as e:
        if isinstance(e, VideoDecodeError):
            raise
        raise VideoDecodeError(f"not a video FFmpeg can decode: {e}") from None
    if not n:
        raise VideoDecodeError("the video has no frames")
    if wanted is not None and n != stream.frames:  # the header's count was wrong: sample what was decoded
        kept = sample_indices(n, rate, fps, factor, max_frames=max_frames).tolist()
        if not all(i in frames for i in kept):
            raise VideoDecodeError(f"the video states {stream.frames} frames but holds {n}; re-encode it")
    return frames, n, rate
