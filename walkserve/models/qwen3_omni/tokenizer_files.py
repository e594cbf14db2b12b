"""The Qwen3-Omni tokenizer from a checkpoint: ``tokenizer.json``, or ``vocab.json`` + ``merges.txt`` (torch-free).

Qwen releases ship the byte-level BPE as ``vocab.json`` + ``merges.txt`` with
the added tokens in ``tokenizer_config.json`` (``added_tokens_decoder``), and
the chat template in ``tokenizer_config.json``, ``chat_template.jinja`` or
``chat_template.json``. Without a ``tokenizer.json`` the tokenizer is built
from those files with Qwen2's rules: NFC, the Qwen2 split regex, byte-level
pieces, no prefix space.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from walkserve.core.errors import ConfigError
from walkserve.models.tokenizer import Tokenizer

# Qwen2's pre-tokenizer split (the same as the tiny tokenizer's)
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def load_tokenizer(directory: str | Path) -> Tokenizer:
    """The checkpoint's tokenizer with its chat template; ConfigError when neither layout is there."""
    directory = Path(directory)
    if (directory / "tokenizer.json").is_file():
        tokenizer = Tokenizer.from_dir(directory)
    elif (directory / "vocab.json").is_file() and (directory / "merges.txt").is_file():
        tokenizer = _from_vocab_and_merges(directory)
    else:
        raise ConfigError(f"{directory}: no tokenizer.json (or vocab.json + merges.txt)")
    if tokenizer.chat_template is None:
        template = _template_json(directory / "chat_template.json")
        if template:
            from walkserve.models.chat_template import ChatTemplate

            tokenizer.chat_template = ChatTemplate(template)
    return tokenizer


def _from_vocab_and_merges(directory: Path) -> Tokenizer:
    from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as Backend

    try:
        bpe = models.BPE.from_file(str(directory / "vocab.json"), str(directory / "merges.txt"), fuse_unk=False,
                                   byte_fallback=False)
    except Exception as e:  # the library raises plain Exception subclasses
        raise ConfigError(f"{directory}: cannot read vocab.json + merges.txt: {e}") from None
    backend = Backend(bpe)
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    config = _json(directory / "tokenizer_config.json")
    added = config.get("added_tokens_decoder") or {}
    tokens = sorted(((int(i), t) for i, t in added.items()), key=lambda it: it[0])
    backend.add_tokens([AddedToken(t["content"], special=bool(t.get("special", True)), normalized=False,
                                   single_word=bool(t.get("single_word", False)), lstrip=bool(t.get("lstrip", False)),
                                   rstrip=bool(t.get("rstrip", False))) for _, t in tokens])
    for i, t in tokens:
        if backend.token_to_id(t["content"]) != i:
            raise ConfigError(f"{directory}: added token {t['content']!r} should have id {i} but gets "
                              f"{backend.token_to_id(t['content'])} (vocab.json and added_tokens_decoder disagree)")
    template = config.get("chat_template")
    jinja = directory / "chat_template.jinja"
    if not isinstance(template, str) and jinja.is_file():
        template = jinja.read_text()
    return Tokenizer(backend, config, template if isinstance(template, str) else None)


def _template_json(path: Path) -> str | None:
    template = _json(path).get("chat_template") if path.is_file() else None
    return template if isinstance(template, str) and template else None


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: invalid JSON: {e}") from None
    return data if isinstance(data, dict) else {}
