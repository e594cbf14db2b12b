"""Which frames a codec firing decodes and which samples it emits (pure integer arithmetic, torch-free).

The codec consumes the audio-token stream through ``SlidingWindow(28, 7)``:
window ``i`` covers tokens ``[7i, 7i + 28)`` = frames ``i .. i+3``. Decoding a
window alone gives poor edges, so each window emits only a frame that has
decoded context on both sides, as the official Orpheus decoder does::

    frames:        0    1    2    3    4    5    6         (F = 7 complete frames, W = 4 windows)
    window 0:    [ E    E    .    . ]                      emits frames 0, 1  (samples 0:4096)
    window 1:         [ .    E    .    . ]                 emits frame 2      (2048:4096)
    window 2:              [ .    E    .    . ]            emits frame 3      (2048:4096)
    window 3:                   [ .    E    .    . ]       emits frame 4      (2048:4096)
    final:                      [ .    .    E    E ]       re-decodes window 3, emits 5, 6 (4096:8192)

The final chunk (the stream ended) spans from the last window's start to the
end; tokens that do not complete a frame are dropped. With no regular window
(fewer than 28 tokens) the final chunk decodes all its F complete frames
(0..3) as one window and emits them all. Every complete frame is emitted
exactly once, so a stream of F complete frames yields F * 2048 samples.

Noise: the SNAC decoder injects Gaussian noise, drawn from a generator seeded
with ``window_seed(request_seed(request_id, seed), token_start)``. Because the
seed depends only on the request and the window's first token, the final
chunk's re-decode of the last window reproduces that window's samples exactly.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from walkserve.streaming.policy import SlidingWindow, Span

FRAME_TOKENS = 7
WINDOW_FRAMES = 4
WINDOW_TOKENS = WINDOW_FRAMES * FRAME_TOKENS
POLICY = SlidingWindow(WINDOW_TOKENS, FRAME_TOKENS)  # the stream policy the codec expects
SEED_BITS = 63


@dataclass(frozen=True)
class WindowPlan:
    """One firing's work: decode ``n_frames`` frames from ``first_frame``; emit window frames ``[emit_start, emit_end)``."""

    first_frame: int
    n_frames: int
    emit_start: int
    emit_end: int

    @property
    def token_start(self) -> int:
        """Stream index of the window's first audio token."""
        return self.first_frame * FRAME_TOKENS

    @property
    def n_tokens(self) -> int:
        return self.n_frames * FRAME_TOKENS

    def sample_range(self, frame_samples: int) -> tuple[int, int]:
        """The emitted slice ``[a, b)`` of the decoded window's samples."""
        return self.emit_start * frame_samples, self.emit_end * frame_samples


def plan_window(span: Span) -> WindowPlan:
    """The plan for the chunk ``span`` of ``SlidingWindow(28, 7)`` (see the module docstring)."""
    if span.start % FRAME_TOKENS:
        raise ValueError(
            f"Orpheus codec: chunk {span.index} starts at token {span.start}, not on a frame"
        )
    first = span.start // FRAME_TOKENS
    if not span.final:
        if span.n_items != WINDOW_TOKENS or first != span.index:
            raise ValueError(
                f"Orpheus codec: chunk {span.index} spans [{span.start}, {span.end}); "
                f"expected a {WINDOW_TOKENS}-token window at {FRAME_TOKENS * span.index}"
            )
        return WindowPlan(first, WINDOW_FRAMES, 0 if span.index == 0 else 1, 2)
    if span.index == 0:  # no regular window ran: decode every complete frame at once
        frames = span.n_items // FRAME_TOKENS
        return WindowPlan(first, frames, 0, frames)
    if span.n_items < WINDOW_TOKENS:
        raise ValueError(
            f"Orpheus codec: final chunk {span.index} has {span.n_items} tokens, "
            f"fewer than the {WINDOW_TOKENS} of the window it re-decodes"
        )
    return WindowPlan(first, WINDOW_FRAMES, WINDOW_FRAMES - 2, WINDOW_FRAMES)


def _hash63(text: str) -> int:
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> (64 - SEED_BITS)


def request_seed(request_id: str, seed: int | None) -> int:
    """The request's noise seed: its sampling seed when set, else a stable hash of its id."""
    return seed if seed is not None else _hash63(f"request:{request_id}")


def window_seed(base: int, token_start: int) -> int:
    """The generator seed for the window starting at audio token ``token_start`` of a request."""
    return _hash63(f"snac-window:{base}:{token_start}")
