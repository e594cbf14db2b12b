"""Video files for V-JEPA 2 (torch-free): every frame decoded with PyAV (the optional ``av`` package), as
uint8 [T, H, W, 3]. The processor samples nothing: the clip loop takes the frames as they come, and a
client wanting another frame rate sends frames (an array, or a frames data URL) instead.
"""

from __future__ import annotations

import io

from walkserve.core.array import ArrayData
from walkserve.core.errors import InvalidRequest

MAX_FRAMES = 768  # as the media loader's frame cap


def decode_video_file(data: bytes, field: str, max_frames: int = MAX_FRAMES) -> ArrayData:
    """A video file's frames [T, H, W, 3] (uint8); a 400 naming ``field`` when it cannot be decoded or is too long."""
    try:
        import av
    except ImportError:
        raise InvalidRequest("decoding video files needs the optional 'av' package; send the frames instead",
                             param=field) from None
    frames = []
    try:
        with av.open(io.BytesIO(data)) as container:
            for frame in container.decode(container.streams.video[0]):
                if len(frames) == max_frames:
                    raise InvalidRequest(f"{field}: the video has more than {max_frames} frames", param=field)
                frames.append(frame.to_ndarray(format="rgb24"))  # [H, W, 3] uint8
    except (av.error.FFmpegError, IndexError, ValueError) as e:
        raise InvalidRequest(f"{field} is not a video FFmpeg can decode: {e}", param=field) from None
    if not frames:
        raise InvalidRequest(f"{field}: the video has no frames", param=field)
    if any(f.shape != frames[0].shape for f in frames):
        raise InvalidRequest(f"{field}: the video's frames change size", param=field)
    return ArrayData("uint8", (len(frames), *frames[0].shape), b"".join(f.tobytes() for f in frames))
