"""Thinker position ids for text, audio, image and video spans (numpy, torch-free): the reference's get_rope_index.

A prompt is a run of segments; each starts one past the largest position of
the segment before it, and all three axes (temporal, height, width) are equal
except inside an image or video:

    text / audio pads       t = h = w = start + i
    <|vision_start|>        one text-like position
    image  (1, h, w) grid   t = start; h, w = start + row, start + col over the merged h/2 x w/2 grid
    video  (T, h, w) grid   t = start + k * second_per_grid * position_id_per_seconds (frame group k)
    <|vision_end|>          one past the block's largest position

A prompt with no image and no video is plain 1-D (0, 1, 2, ...), audio
included. Video times may be fractional (e.g. 2 frames at 24 fps: 2 / 24 x 13
per group): the positions are then float, as in the reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from walkserve.models.qwen3_omni.config import OmniTokenIds
from walkserve.models.qwen3_omni.thinker.media_tokens import audio_token_count, vision_token_count


@dataclass(frozen=True)
class RopeIndex:
    """``positions`` [3, T] (int64, or float32 when a video time is fractional); decode step i (0-based)
    sits at ``next_position + i`` on all three axes."""

    positions: np.ndarray
    next_position: float | int


@dataclass(frozen=True)
class MediaGrids:
    """What the positions need to know of a prompt's media, in order of appearance in the prompt."""

    image_grids: Sequence[Sequence[int]] = ()  # (t, h, w) patches per image
    video_grids: Sequence[Sequence[int]] = ()  # (t, h, w) patches per video
    video_seconds_per_grid: Sequence[float] = ()  # temporal_patch_size / fps per video
    audio_frames: Sequence[int] = ()  # mel frames per audio clip


def rope_index(
    input_ids: Sequence[int],
    media: MediaGrids,
    tokens: OmniTokenIds,
    merge_size: int = 2,
    n_window: int = 50,
    position_id_per_seconds: float = 13.0,
) -> RopeIndex:
    """Positions of one prompt (the token ids after placeholder expansion)."""
    ids = np.asarray(input_ids, dtype=np.int64)
    n = len(ids)
    if not len(media.image_grids) and not len(media.video_grids):
        return RopeIndex(np.broadcast_to(np.arange(n, dtype=np.int64), (3, n)).copy(), n)
    blocks, start, i = [], np.float32(0), 0  # float32 arithmetic throughout, as the reference
    counters = {"image": 0, "video": 0, "audio": 0}
    while i < n:
        span, kind = _media_span(ids, i, tokens)
        if kind is None:
            blocks.append(_text(start, span))
        else:
            blocks.append(_text(start, 1))  # the start marker
            body = _media_positions(kind, counters, media, start + 1, merge_size, n_window, position_id_per_seconds)
            if body.shape[1] != span - 2:
                raise ValueError(f"{kind} {counters[kind]} has {span - 2} placeholder tokens, its grid/length "
                                 f"gives {body.shape[1]}")
            counters[kind] += 1
            blocks.append(body)
            blocks.append(_text(body.max() + 1 if body.size else start + 1, 1))  # the end marker
        start = blocks[-1].max() + np.float32(1)
        i += span
    _check_used(counters, media)
    positions = np.concatenate(blocks, axis=1)
    integral = bool(np.all(positions == np.round(positions)))
    next_position = float(positions.max()) + 1
    if integral:
        return RopeIndex(positions.astype(np.int64), int(next_position))
    return RopeIndex(positions.astype(np.float32), next_position)


def _media_span(ids: np.ndarray, i: int, tokens: OmniTokenIds) -> tuple[int, str | None]:
    """(length, kind) of the segment starting at ``i``: a media block incl. markers, or a text run."""
    pads = {tokens.image_token_id: "image", tokens.video_token_id: "video", tokens.audio_token_id: "audio"}
    starts = (tokens.vision_start_token_id, tokens.audio_start_token_id)
    if ids[i] in starts and i + 1 < len(ids) and int(ids[i + 1]) in pads:
        pad = int(ids[i + 1])
        j = i + 1
        while j < len(ids) and ids[j] == pad:
            j += 1
        if j == len(ids):
            raise ValueError(f"the {pads[pad]} block at token {i} has no end marker")
        return j + 1 - i, pads[pad]
    j = i + 1
    while j < len(ids) and not (ids[j] in starts and j + 1 < len(ids) and int(ids[j + 1]) in pads):
        j += 1
    return j - i, None


def _text(start: np.float32, length: int) -> np.ndarray:
    return np.broadcast_to(np.float32(start) + np.arange(length, dtype=np.float32), (3, length)).copy()


def _media_positions(kind: str, counters: dict[str, int], media: MediaGrids, start: np.float32, merge: int,
                     n_window: int, per_second: float) -> np.ndarray:
    k = counters[kind]
    if kind == "audio":
        if k >= len(media.audio_frames):
            raise ValueError(f"the prompt has more audio blocks than the {len(media.audio_frames)} clips given")
        return _text(start, audio_token_count(int(media.audio_frames[k]), n_window))
    grids = media.image_grids if kind == "image" else media.video_grids
    if k >= len(grids):
        raise ValueError(f"the prompt has more {kind} blocks than the {len(grids)} grids given")
    t, h, w = (int(v) for v in grids[k])
    vision_token_count((t, h, w), merge)  # validates the grid
    step = np.float32(1.0) if kind == "image" else np.float32(media.video_seconds_per_grid[k])
    times = np.arange(t, dtype=np.float32) * step * per_second  # float32, as the reference computes them
    gh, gw = h // merge, w // merge
    t_pos = np.repeat(times, gh * gw)
    h_pos = np.tile(np.repeat(np.arange(gh, dtype=np.float32), gw), t)
    w_pos = np.tile(np.arange(gw, dtype=np.float32), t * gh)
    return np.stack([t_pos, h_pos, w_pos]) + np.float32(start)


def _check_used(counters: dict[str, int], media: MediaGrids) -> None:
    given = {"image": len(media.image_grids), "video": len(media.video_grids), "audio": len(media.audio_frames)}
    for kind, used in counters.items():
        if used != given[kind]:
            raise ValueError(f"the prompt has {used} {kind} block(s) but {given[kind]} were given")
