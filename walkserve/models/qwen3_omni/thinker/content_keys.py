"""Per-row content keys of a thinker prompt: what the prefix cache keys its media rows on (torch-free).

A text row is its token id (key 0). A media placeholder row's embedding is the encoder's output for
its item, so its key is a digest of exactly what the encoder takes (the image's or video's patches and
grid; for audio, below): two prompts share a block only when every row's token, content and position
agree, never on the placeholder tokens alone.

    ids      |<|im_start|> user \\n <|audio_start|>|pad pad ... pad|<|audio_end|> What ? ...|
    content  |     0        0   0       0        | k0 k0 .. k1 k1 |     0        0   0 ...|

Audio is keyed per window of the encoder: it attends only inside windows of ``n_window_infer`` mel
frames (whole conv chunks), so a window's tokens are a function of that window's features alone.
Window w's rows get the chained key ``k_w = digest(k_{w-1}, mel[:, window w])`` (its frames, possibly
fewer than a full window at the end). A clip that extends another (audio prefilled while it arrives,
then committed longer) therefore shares the keys, and so the cached blocks, of every window whose
features came out the same; a window whose features differ (it was still incomplete, or the clip's
loudest frame, which sets the ``max - 8`` floor, came later) and everything after it are computed again.
"""

from __future__ import annotations

import hashlib

import numpy as np

from walkserve.models.qwen3_omni.config import OmniTokenIds
from walkserve.models.qwen3_omni.thinker.prompt import media_spans
from walkserve.models.qwen3_omni.thinker.request import ThinkerRequest

_MASK = (1 << 63) - 1  # keys are int64 and nonzero


def digest(kind: str, *arrays: np.ndarray) -> int:
    """A nonzero 63-bit key of ``kind`` and the arrays' dtypes, shapes and bytes."""
    h = hashlib.blake2b(kind.encode(), digest_size=8)
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"|{a.dtype}{a.shape}|".encode())
        h.update(a.data)
    return int.from_bytes(h.digest(), "little") & _MASK or 1


def audio_window_keys(mel: np.ndarray, window: int) -> list[int]:
    """The chained key of each encoder window of a clip's features ``mel`` [n_mels, F] (windows of ``window``
    frames, the last one possibly shorter)."""
    keys, key = [], 0
    for start in range(0, mel.shape[1], window):
        key = digest("audio", np.asarray([key], np.int64), mel[:, start : start + window].astype(np.float32))
        keys.append(key)
    return keys


def content_keys(request: ThinkerRequest, tokens: OmniTokenIds) -> np.ndarray:
    """int64 [n]: 0 on text rows, the digest of its item's encoder input on each media row (per window, audio)."""
    keys = np.zeros(len(request.input_ids), dtype=np.int64)
    for span in media_spans(request.input_ids, tokens):
        keys[span.start : span.end] = _item_keys(request, span.kind, span.index, span.end - span.start)
    return keys


def _item_keys(request: ThinkerRequest, kind: str, index: int, rows: int) -> np.ndarray | int:
    if kind == "audio":
        windows = audio_window_keys(request.audio[index], request.audio_window)
        return np.repeat(np.asarray(windows, np.int64), request.audio_window_tokens)[:rows]
    vision = request.images[index] if kind == "image" else request.videos[index].vision
    return digest(kind, vision.pixel_values.astype(np.float32), np.asarray(vision.grid_thw, np.int64))
