"""A stand-in for a 64-bit digest collision: every BLAKE2b digest made while it is on starts with the same 8 bytes.

A media key of 64 bits or fewer is then equal for every input (what a client finds after about 2**32 tries); a
128-bit key (``walkserve/models/common/content_key.py``) still tells inputs apart by its other 8 bytes.
"""

from __future__ import annotations

import hashlib


class _Colliding:
    """A BLAKE2b whose digests all start with the same 8 bytes (the rest is the real digest's)."""

    def __init__(self, real):
        self._h = real

    def update(self, data) -> None:
        self._h.update(data)

    def copy(self) -> _Colliding:
        return _Colliding(self._h.copy())

    def digest(self) -> bytes:
        return b"\x5a" * 8 + self._h.digest()[8:]


def collide_in_64_bits(monkeypatch) -> None:
    """Make ``hashlib.blake2b`` collide in its first 64 bits until ``monkeypatch`` undoes it."""
    real = hashlib.blake2b
    monkeypatch.setattr(hashlib, "blake2b", lambda *a, **kw: _Colliding(real(*a, **kw)))
