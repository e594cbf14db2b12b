"""Incremental detokenization that never splits a multi-byte character and never repeats text."""

from __future__ import annotations

from collections.abc import Callable

from walkserve.models.processor import Detokenizer

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer(Detokenizer):
    """Streams text for a growing list of token ids.

    Keeps two offsets into the ids: text up to ``read`` has been emitted, and
    ``prefix`` marks where a small decoding window starts. For each new token
    the window is decoded with and without the unread tokens; the difference
    is the new text. While that text ends in U+FFFD the last token holds an
    incomplete UTF-8 sequence (a byte-level token split an emoji or a CJK
    character), so nothing is emitted until a later token completes it.
    Decoding a window that starts at ``prefix`` rather than at 0 keeps each
    step cheap, and decoders that strip a leading space treat both decodes alike.
    """

    def __init__(self, decode: Callable[[list[int]], str]):
        self._decode = decode
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def push(self, token_ids: list[int]) -> str:
        out = []
        for token in token_ids:
            self._ids.append(int(token))
            out.append(self._step())
        return "".join(out)

    def _step(self) -> str:
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        full_text = self._decode(self._ids[self._prefix :])
        if len(full_text) <= len(prefix_text) or full_text.endswith(_REPLACEMENT):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return full_text[len(prefix_text) :]

    def flush(self) -> str:
        """Whatever was held back (an unfinished character decodes as U+FFFD)."""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        full_text = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return full_text[len(prefix_text) :]
