"""Per-row content keys of a thinker prompt: what the prefix cache keys its media rows on (torch-free).

A text row is its token id (key (0, 0)). A media placeholder row's embedding is the encoder's output for
its item, so its key is a 128-bit digest of exactly what the encoder takes (the image's or video's patches
and grid; for audio, below; ``common/content_key.py``: two int64 columns, so no client can build two inputs
with one key): two prompts share a block only when every row's token, content and position agree, never on
the placeholder tokens alone.

    ids      |<|im_start|> user \\n <|audio_start|>|pad pad ... pad|<|audio_end|> What ? ...|
    content  |     0        0   0       0        | k0 k0 .. k1 k1 |     0        0   0 ...|   (each k: 2 columns)

Audio is keyed per window of the encoder: it attends only inside windows of ``n_window_infer`` mel
frames (whole conv chunks), so a window's tokens are a function of that window's features alone.
Window w's rows get the chained key ``k_w = digest(k_{w-1}, mel[:, window w])`` (its frames, possibly
fewer than a full window at the end). A clip that extends another (audio prefilled while it arrives,
then committed longer) therefore shares the keys, and so the cached blocks, of every window whose
features came out the same; a window whose features differ (it was still incomplete, or the clip's
loudest frame, which sets the ``max - 8`` floor, came later) and everything after it are computed again.
"""

from __future__ import annotations

import numpy as np

from walkserve.models.common.content_key import KEY_COLUMNS, content_key, text_keys
from walkserve.models.qwen3_omni.config import OmniTokenIds
from walkserve.models.qwen3_omni.thinker.prompt import media_spans
from walkserve.models.qwen3_omni.thinker.request import ThinkerRequest


def audio_window_keys(mel: np.ndarray, window: int) -> list[tuple[int, int]]:
    """The chained key of each encoder window of a clip's features ``mel`` [n_mels, F] (windows of ``window``
    frames, the last one possibly shorter)."""
    keys, key = [], (0, 0)
    for start in range(0, mel.shape[1], window):
        key = content_key("audio", np.asarray(key, np.int64), mel[:, start : start + window].astype(np.float32))
        keys.append(key)
    return keys


def content_keys(request: ThinkerRequest, tokens: OmniTokenIds) -> np.ndarray:
    """int64 [n, 2]: (0, 0) on text rows, the key of its item's encoder input on each media row (per window,
    audio)."""
    keys = text_keys(len(request.input_ids))
    for span in media_spans(request.input_ids, tokens):
        keys[span.start : span.end] = _item_keys(request, span.kind, span.index, span.end - span.start)
    return keys


def _item_keys(request: ThinkerRequest, kind: str, index: int, rows: int) -> np.ndarray | tuple[int, int]:
    if kind == "audio":
        windows = np.asarray(audio_window_keys(request.audio[index], request.audio_window), np.int64)
        return np.repeat(windows.reshape(-1, KEY_COLUMNS), request.audio_window_tokens, axis=0)[:rows]
    vision = request.images[index] if kind == "image" else request.videos[index].vision
    return content_key(kind, vision.pixel_values.astype(np.float32), np.asarray(vision.grid_thw, np.int64))
