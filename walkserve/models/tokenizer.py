"""Tokenizer: an HF ``tokenizer.json`` (``tokenizers`` library) plus ``tokenizer_config.json``.

Torch-free; used by processors in the API process. The chat template comes
from ``tokenizer_config.json`` (``chat_template``: a string, or a list of
``{"name", "template"}`` where "default" is used) or from a
``chat_template.jinja`` file next to it (what transformers 5 writes).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from walkserve.core.errors import ConfigError, InvalidRequest
from walkserve.models.chat_template import ChatTemplate
from walkserve.models.detokenizer import IncrementalDetokenizer
from walkserve.models.token_span import max_chars_per_token


class Tokenizer:
    """Encode, decode, stream-decode and render chat prompts for one checkpoint."""

    def __init__(self, backend: Any, config: dict[str, Any] | None = None, chat_template: str | None = None):
        self.backend = backend  # tokenizers.Tokenizer
        decoder = json.loads(backend.decoder.__getstate__()) if backend.decoder is not None else {}
        self._pieces = _piece_bytes(decoder)  # vocabulary piece -> the bytes it stands for
        self._added = set(backend.get_added_tokens_decoder())  # ids of added (special) tokens
        # the most characters of text one token can cover (token_span.py; None: no bound), read once here and
        # not at the first request: the API asks on its event loop
        self.chars_per_token = max_chars_per_token(json.loads(backend.to_str()))
        self.config = dict(config or {})
        self.chat_template = ChatTemplate(chat_template) if chat_template else None
        self.bos_token = _token_text(self.config.get("bos_token"))
        self.eos_token = _token_text(self.config.get("eos_token"))
        self.pad_token = _token_text(self.config.get("pad_token"))

    @classmethod
    def from_dir(cls, directory: str | Path) -> Tokenizer:
        """Load ``tokenizer.json`` (+ ``tokenizer_config.json``, ``chat_template.jinja``) from a checkpoint."""
        from tokenizers import Tokenizer as Backend

        directory = Path(directory)
        path = directory / "tokenizer.json"
        if not path.is_file():
            raise ConfigError(f"{directory}: no tokenizer.json")
        try:
            backend = Backend.from_file(str(path))
        except Exception as e:  # the library raises plain Exception subclasses
            raise ConfigError(f"{path}: cannot load tokenizer: {e}") from None
        config = _read_json(directory / "tokenizer_config.json")
        return cls(backend, config, _chat_template(directory, config))

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_id(self, token: str | None) -> int | None:
        return None if token is None else self.backend.token_to_id(token)

    @property
    def bos_token_id(self) -> int | None:
        return self.token_id(self.bos_token)

    @property
    def eos_token_id(self) -> int | None:
        return self.token_id(self.eos_token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids; ``add_special_tokens`` runs the tokenizer's post-processor (e.g. a BOS prefix).

        Through ``encode_batch_fast``: the same ids as ``encode``, but it lets go of the GIL while it works
        (``encode`` holds it: a 2 MB prompt froze every other thread of the API process, its event loop
        included, for seconds) and computes no offsets (about 3x faster).
        """
        try:
            return self.backend.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids
        except BaseException as e:  # a panic in the library is pyo3's PanicException, a BaseException
            if type(e).__name__ != "PanicException":
                raise
            # e.g. its split regex on a run of millions of spaces ("retry-limit-in-match over"): the text's fault
            raise InvalidRequest(f"the tokenizer cannot split this text ({e})", code="untokenizable_text") from None

    def min_tokens(self, text: str) -> int:
        """A floor on the tokens of ``text`` without tokenizing it (0 where no bound holds)."""
        per_token = self.chars_per_token
        return 0 if per_token is None else -(-len(text) // per_token)

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def detokenizer(self, skip_special_tokens: bool = True) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(lambda ids: self.decode(ids, skip_special_tokens))

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for: a piece of a multi-byte character is its raw bytes.

        Byte-level BPE vocabularies (GPT-2, Llama 3, Qwen) spell bytes as
        printable characters; SentencePiece ones spell a space as U+2581 and
        unknown bytes as ``<0xAB>`` pieces. Added (special) tokens are their text.
        """
        piece = self.backend.id_to_token(int(token_id))
        if piece is None:
            return b""
        if token_id in self._added:
            return piece.encode("utf-8")
        return self._pieces(piece)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **variables: Any
    ) -> str:
        """The prompt text (not tokenized). Raises ConfigError without a template, TemplateError from it."""
        if self.chat_template is None:
            raise ConfigError("this tokenizer has no chat template")
        variables.setdefault("bos_token", self.bos_token or "")
        variables.setdefault("eos_token", self.eos_token or "")
        return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt, **variables)


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte -> printable character table, inverted: printable bytes stand for themselves, the rest
    for the characters from U+0100 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def _piece_bytes(decoder: dict[str, Any]) -> Any:
    """How to turn a vocabulary piece into bytes (a function piece -> bytes), from the tokenizer's decoder spec."""
    kinds = {d.get("type") for d in decoder.get("decoders", [])} | {decoder.get("type")}
    if "ByteLevel" in kinds:
        alphabet = _byte_level_alphabet()

        def byte_level(piece: str) -> bytes:
            if all(c in alphabet for c in piece):
                return bytes(alphabet[c] for c in piece)
            return piece.encode("utf-8")

        return byte_level

    def sentencepiece(piece: str) -> bytes:
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            try:
                return bytes([int(piece[3:5], 16)])
            except ValueError:
                pass
        return piece.replace("\u2581", " ").encode("utf-8")

    return sentencepiece


def _token_text(value: Any) -> str | None:
    """Special tokens are written as a string or as an AddedToken dict ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: invalid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return data


def _chat_template(directory: Path, config: dict[str, Any]) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if isinstance(template, str) and template:
        return template
    jinja_file = directory / "chat_template.jinja"
    return jinja_file.read_text() if jinja_file.is_file() else None
