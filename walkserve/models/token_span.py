"""How many characters of text one token can stand for at most, read from a ``tokenizer.json`` spec.

The big idea: a text of n characters has at least ceil(n / L) tokens when no
token covers more than L characters of it. That floor, known without
tokenizing, lets the API refuse a prompt that cannot fit the served context
before spending seconds on it (``Processor.check_text_fits``). The floor must
never refuse a prompt that would fit, so L is an upper bound that holds for
every text, and None where the tokenizer has no such bound:

    piece   a vocabulary piece covers at most len(piece) characters: a
            byte-level piece spells one byte per character and a character is
            one byte or more; a SentencePiece piece spells one character per
            character (U+2581 for a space, ``<0xAB>`` for one byte);
            ``##``-style prefixes and ``</w>``-style suffixes only overcount
    added   an added token covers its content, matched in the text as is
            (``normalized: false``) or after normalization
    shrink  a normalizer may shorten text: NFC / NFKC compose up to
            ``LONGEST_DECOMPOSITION`` code points into one, a Replace of a
            literal string by a shorter one shortens by their ratio; what may
            delete text (Strip, StripAccents, BERT's cleaning, a regex
            Replace, a precompiled charsmap) has no bound
    dropped a pre-tokenizer that drops text (Whitespace, a split that
            removes its matches), an unknown token that swallows a run of
            characters (WordPiece's whole-word [UNK], a fused or WordLevel
            unknown) or an added token that strips the whitespace around it
            has no bound either

So L = max(raw added, shrink * max(piece, normalized added)).
"""

from __future__ import annotations

import math
from typing import Any

LONGEST_DECOMPOSITION = 4  # code points in the longest canonical decomposition (U+1F82: alpha + 3 marks)
_KEEP_LENGTH = {"NFD", "NFKD", "Lowercase", "Prepend", "ByteLevel"}  # never shorten: each character maps to 1+
_COMPOSE = {"NFC", "NFKC"}
_KEEP_TEXT = {"ByteLevel", "Metaspace", "Digits", "UnicodeScripts"}  # pre-tokenizers that split and drop nothing
_SPLITTING = {"Split", "Punctuation"}  # keep their matches unless behavior is "removed"


def max_chars_per_token(spec: dict[str, Any]) -> int | None:
    """The most characters one token of this tokenizer can cover, or None where no bound holds."""
    shrink = _shrink(spec.get("normalizer"))
    if shrink is None or not _keeps_text(spec.get("pre_tokenizer")) or not _bounded_unknowns(spec.get("model") or {}):
        return None
    added = spec.get("added_tokens") or []
    if any(t.get("lstrip") or t.get("rstrip") for t in added):
        return None
    raw = [len(t["content"]) for t in added if not t.get("normalized")]
    normalized = [len(t["content"]) for t in added if t.get("normalized")]
    pieces = _pieces(spec.get("model") or {})
    longest = max([1, *pieces, *normalized])
    return math.ceil(max([shrink * longest, *raw]))  # a Replace's ratio may be fractional


def _shrink(normalizer: dict[str, Any] | None) -> float | None:
    """By how much the normalizer can shorten a text at most (1: never), None: unbounded."""
    if normalizer is None:
        return 1.0
    kind = normalizer.get("type")
    if kind == "Sequence":
        total = 1.0
        for step in normalizer.get("normalizers", []):
            factor = _shrink(step)
            if factor is None:
                return None
            total *= factor
        return total
    if kind in _KEEP_LENGTH:
        return 1.0
    if kind in _COMPOSE:
        return float(LONGEST_DECOMPOSITION)
    if kind == "Replace":
        pattern, content = normalizer.get("pattern") or {}, normalizer.get("content", "")
        if "String" not in pattern or not content or not pattern["String"]:
            return None  # a regex, or a replacement by nothing, may delete any amount of text
        return max(1.0, len(pattern["String"]) / len(content))
    return None


def _keeps_text(pre_tokenizer: dict[str, Any] | None) -> bool:
    """Whether every character of the normalized text ends up in some token."""
    if pre_tokenizer is None:
        return True
    kind = pre_tokenizer.get("type")
    if kind == "Sequence":
        return all(_keeps_text(p) for p in pre_tokenizer.get("pretokenizers", []))
    if kind in _SPLITTING:
        return str(pre_tokenizer.get("behavior", "Isolated")).lower() != "removed"
    return kind in _KEEP_TEXT


def _bounded_unknowns(model: dict[str, Any]) -> bool:
    """Whether an unknown token, where the model emits one, covers a bounded run of text (one character)."""
    kind = model.get("type")
    if kind == "BPE":
        return model.get("unk_token") is None or bool(model.get("byte_fallback")) or not model.get("fuse_unk")
    if kind == "Unigram":
        return model.get("unk_id") is None or bool(model.get("byte_fallback"))
    return False  # WordPiece: a word over max_input_chars_per_word is one [UNK]; WordLevel: any unknown word


def _pieces(model: dict[str, Any]) -> list[int]:
    vocab = model.get("vocab") or {}
    if isinstance(vocab, dict):  # BPE, WordPiece: piece -> id
        return [len(piece) for piece in vocab]
    return [len(entry[0]) for entry in vocab]  # Unigram: [piece, score]
