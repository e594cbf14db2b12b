"""Collision-resistant digests of row keys: what the prefix cache and the capture cache key reused rows on.

A cache that hands one request another's KV when their keys collide answers silently wrong and leaks the other
prompt, so keys are never Python's ``hash()`` (64 bits, the same in every process and cheap to invert: a client
could build a colliding prompt on purpose). Rows are keyed on a BLAKE2b digest (32 bytes) of a canonical encoding
of their keys (ints; tuples such as ``(token, content, positions)`` or ``(key, digest)``; bytes):

    chain(parent, rows)   blake2b(parent ‖ encode(rows))       a run of rows after a history (ROOT: none)
    digests(rows, ends)   blake2b(item(rows[0]) ‖ item(rows[1]) ‖ … up to each end)   whole histories

    encode(rows)          marshal format version 2 of the list of keys: b"[" count, then item(key) for each
    item(key)             b"i" int32 | b"l" n digits (a larger int) | b"(" count item… (a tuple) | b"s" len bytes …

Marshal is C-fast and writes every object with its type and its length, so two encodings are equal only for equal
keys of equal structure (an int never passes for a tuple, nor ``((1, 2), 3)`` for ``(1, (2, 3))``); version 2
writes no back-references, so equal keys give equal bytes whatever objects hold them, in every process and on every
host (little-endian by definition): digests may cross ranks. A key marshal cannot write is a ValueError.
"""

from __future__ import annotations

import marshal
from collections.abc import Sequence
from hashlib import blake2b
from typing import Any

DIGEST_SIZE = 32
ROOT = bytes(DIGEST_SIZE)  # the parent of a context's first rows
_VERSION = 2  # no back-references (version 3 on): the bytes depend only on the values
_LIST_HEAD = 5  # b"[" and a 4-byte count
_CHAIN = blake2b(digest_size=DIGEST_SIZE, person=b"walkserve-chain")  # copied: cheaper than the keywords each time
_ROWS = blake2b(digest_size=DIGEST_SIZE, person=b"walkserve-rows")


def chain(parent: bytes, rows: Sequence[Any]) -> bytes:
    """The digest of ``rows``' keys after the history whose digest is ``parent`` (``ROOT`` for none)."""
    h = _CHAIN.copy()
    h.update(parent)
    h.update(encode(rows))
    return h.digest()


def digests(rows: Sequence[Any], ends: Sequence[int]) -> list[bytes]:
    """For each ``n`` of ``ends`` (ascending), a digest of ``rows[:n]``, whatever the other ends (each row encoded
    once)."""
    h, out, at = _ROWS.copy(), [], 0
    for n in ends:
        h.update(encode(rows[at:n])[_LIST_HEAD:])  # the keys' own encodings, back to back: no count to split on
        out.append(h.copy().digest())
        at = n
    return out


def encode(rows: Sequence[Any]) -> bytes:
    """The canonical bytes of a run of row keys (module docstring)."""
    return marshal.dumps(rows if type(rows) is list else list(rows), _VERSION)
