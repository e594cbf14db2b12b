"""SentencePiece BPE encoding in plain Python (torch-free): the PaliGemma tokenizer.

The same algorithm as the sentencepiece library's BPE model, so ids match it
exactly (tests compare the two on tiny models):

1. normalise: optionally strip and collapse spaces, optionally prepend a
   space (dummy prefix), write spaces as U+2581;
2. split into symbols: the longest user-defined piece at each position (never
   merged further), else one character;
3. merge: repeatedly join the adjacent pair whose concatenation is a piece with
   the highest score (ties: the leftmost pair);
4. split merged UNUSED pieces back into the pieces they were made of;
5. map each symbol to its id; a symbol that is no piece becomes its UTF-8
   bytes' ``<0xXX>`` pieces (byte fallback) or the unknown id.

Only the identity normaliser is supported (PaliGemma's); a model with a
precompiled character map (NFKC rules) is refused.
"""

from __future__ import annotations

import heapq
from pathlib import Path

from walkserve.core.errors import ConfigError
from walkserve.models.pi0.spm_model import (
    BPE,
    BYTE,
    CONTROL,
    UNKNOWN,
    UNUSED,
    USER_DEFINED,
    SpmModel,
    read_model,
)

SPACE = "\u2581"


class SentencePieceTokenizer:
    """Encode text to ids with a SentencePiece BPE model."""

    def __init__(self, model: SpmModel):
        if model.model_type != BPE:
            raise ConfigError(f"SentencePiece model type {model.model_type} is not supported (only BPE, type 2)")
        if model.has_charsmap or model.treat_whitespace_as_suffix:
            raise ConfigError("SentencePiece models with a character map or suffix whitespace are not supported")
        self.model = model
        self._ids: dict[str, int] = {}  # pieces merges may produce: NORMAL, USER_DEFINED, UNUSED
        self._reserved: dict[str, int] = {}  # CONTROL, UNKNOWN, BYTE
        self._scores: dict[str, float] = {}
        self._unused: set[str] = set()
        user: list[str] = []
        for i, (piece, score, kind) in enumerate(model.pieces):
            if kind in (CONTROL, UNKNOWN, BYTE):
                self._reserved.setdefault(piece, i)
                continue
            self._ids.setdefault(piece, i)
            self._scores[piece] = score
            if kind == USER_DEFINED:
                user.append(piece)
            if kind == UNUSED:
                self._unused.add(piece)
        self._user = sorted(set(user), key=len, reverse=True)
        self._user_first = {p[0] for p in self._user}

    @classmethod
    def from_file(cls, path: str | Path) -> SentencePieceTokenizer:
        return cls(read_model(path))

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    @property
    def bos_id(self) -> int:
        return self.model.bos_id

    @property
    def eos_id(self) -> int:
        return self.model.eos_id

    def piece_id(self, piece: str) -> int | None:
        return self._reserved.get(piece, self._ids.get(piece))

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        """Token ids of ``text``, with the BOS id first when ``add_bos``."""
        ids = [self.model.bos_id] if add_bos else []
        for symbol in self._merge(self._symbols(self._normalize(text))):
            ids.extend(self._symbol_ids(symbol))
        return ids

    def _normalize(self, text: str) -> str:
        m = self.model
        if m.remove_extra_whitespaces:
            text = " ".join(part for part in text.split(" ") if part)
        if m.add_dummy_prefix and text:
            text = " " + text
        return text.replace(" ", SPACE) if m.escape_whitespaces else text

    def _symbols(self, text: str) -> list[tuple[str, bool]]:
        """(symbol, frozen) pairs: user-defined pieces (frozen) and single characters."""
        out, i = [], 0
        while i < len(text):
            match = None
            if text[i] in self._user_first:
                match = next((p for p in self._user if text.startswith(p, i)), None)
            if match is not None:
                out.append((match, True))
                i += len(match)
            else:
                out.append((text[i], False))
                i += 1
        return out

    def _merge(self, symbols: list[tuple[str, bool]]) -> list[str]:
        """The BPE merge loop over a doubly linked list of symbols, best-scoring pair first."""
        pieces = [s for s, _ in symbols]
        frozen = [f for _, f in symbols]
        prev = list(range(-1, len(pieces) - 1))
        nxt = [*range(1, len(pieces)), -1]
        agenda: list[tuple[float, int, int, int]] = []  # (-score, left, right, merged length)
        merged_from: dict[str, tuple[str, str]] = {}

        def push(left: int, right: int) -> None:
            if left < 0 or right < 0 or frozen[left] or frozen[right]:
                return
            joined = pieces[left] + pieces[right]
            if joined not in self._ids:
                return
            heapq.heappush(agenda, (-self._scores[joined], left, right, len(joined)))
            if joined in self._unused:
                merged_from[joined] = (pieces[left], pieces[right])

        for i in range(len(pieces) - 1):
            push(i, i + 1)
        while agenda:
            _, left, right, size = heapq.heappop(agenda)
            if not pieces[left] or not pieces[right] or len(pieces[left]) + len(pieces[right]) != size:
                continue  # stale: one side was merged elsewhere since this pair was pushed
            pieces[left] += pieces[right]
            pieces[right] = ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            push(prev[left], left)
            push(left, nxt[left])
        out: list[str] = []
        for piece in pieces:
            if piece:
                self._resegment(piece, merged_from, out)
        return out

    def _resegment(self, piece: str, merged_from: dict[str, tuple[str, str]], out: list[str]) -> None:
        if piece in self._unused and piece in merged_from:
            left, right = merged_from[piece]
            self._resegment(left, merged_from, out)
            self._resegment(right, merged_from, out)
        else:
            out.append(piece)

    def _symbol_ids(self, symbol: str) -> list[int]:
        found = self.piece_id(symbol)
        if found is not None:
            return [found]
        if self.model.byte_fallback:
            return [self._reserved[f"<0x{b:02X}>"] for b in symbol.encode("utf-8")]
        return [self.model.unk_id]
