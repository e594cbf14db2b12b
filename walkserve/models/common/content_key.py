"""Content keys of media rows: 128-bit BLAKE2b digests of what an encoder takes, as two int64 columns (torch-free).

The prefix cache and the capture cache hand a media row the KV (or captured layers) of an earlier row whose key
(token id, content, positions) is equal (``engines/kv/sequence.py``), and an encoder's feature cache hands out the
features of an earlier input with the same key. So two different media inputs must never share a key, even when a
client builds them to: a 63- or 64-bit digest collides after about 2**32 tries (birthday), which would hand whoever
later sends the second input (a published image) the first one's answer. A key is therefore 16 bytes of BLAKE2b,
written into a prompt's content as two int64 columns per row:

    content  int64 [n, 2]   text row: (0, 0)   media row: its item's key (lo, hi), signed little-endian halves

A row carries its item's whole key (not a slice of it), so the rows of one item (or of one audio window) keep equal
keys: the capture cache's runs and the audio windows' chain depend on that.
"""

from __future__ import annotations

import hashlib

import numpy as np

KEY_COLUMNS = 2  # int64 columns per row: 128 bits
DIGEST_SIZE = 8 * KEY_COLUMNS


def content_key(kind: str, *arrays: np.ndarray) -> tuple[int, int]:
    """A nonzero 128-bit key of ``kind`` and the arrays' dtypes, shapes and bytes (in order)."""
    h = hashlib.blake2b(kind.encode(), digest_size=DIGEST_SIZE)
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"|{a.dtype.str}{a.shape}|".encode())
        h.update(a.data)
    d = h.digest()
    lo, hi = int.from_bytes(d[:8], "little", signed=True), int.from_bytes(d[8:], "little", signed=True)
    return (lo or 1, hi) if not hi else (lo, hi)


def text_keys(n: int) -> np.ndarray:
    """int64 [n, 2] of zeros: the content of ``n`` rows that are their token ids."""
    return np.zeros((n, KEY_COLUMNS), dtype=np.int64)
