"""How many thinker tokens one media item becomes (torch-free; the processor, positions and encoders agree on it).

Audio: mel frames are cut into chunks of ``2 * n_window`` (100) frames; three
stride-2 convolutions turn a chunk of L frames into ``conv_length(L)`` tokens
(13 for a full chunk), so a clip of F frames gives ``13 * (F // 100) +
conv_length(F % 100)`` tokens (13 tokens per second of audio).

Vision: a grid of (t, h, w) patches becomes ``t * h * w / merge**2`` tokens.
"""

from __future__ import annotations

from collections.abc import Sequence


def conv_length(frames: int) -> int:
    """Output length of three stride-2, kernel-3, padding-1 convolutions over ``frames`` (0 -> 0)."""
    if frames <= 0:
        return 0
    for _ in range(3):
        frames = (frames - 1) // 2 + 1
    return frames


def audio_token_count(frames: int, n_window: int = 50) -> int:
    """Thinker tokens of a clip of ``frames`` mel frames (the reference's ``_get_feat_extract_output_lengths``)."""
    chunk = 2 * n_window
    return (frames // chunk) * conv_length(chunk) + conv_length(frames % chunk)


def audio_chunk_lengths(frames: int, n_window: int = 50) -> list[int]:
    """Mel frames of each chunk of a clip: full chunks, then the remainder (if any)."""
    chunk = 2 * n_window
    lengths = [chunk] * (frames // chunk)
    if frames % chunk:
        lengths.append(frames % chunk)
    return lengths


def vision_token_count(grid_thw: Sequence[int], merge_size: int = 2) -> int:
    """Thinker tokens of an image or video of ``(t, h, w)`` patches."""
    t, h, w = (int(v) for v in grid_thw)
    if h % merge_size or w % merge_size:
        raise ValueError(f"grid {t}x{h}x{w} is not divisible by the merge size {merge_size}")
    return t * h * w // merge_size**2
