"""token_span: the most characters one token can cover, and the token floor it gives, never above the truth."""

from __future__ import annotations

import random
import unicodedata

import pytest

from walkserve.core.errors import InvalidRequest
from walkserve.models.common.tiny_tokenizer import write_tokenizer
from walkserve.models.token_span import LONGEST_DECOMPOSITION, max_chars_per_token
from walkserve.models.tokenizer import Tokenizer

BPE = {"type": "BPE", "vocab": {"a": 0, "abc": 1, "▁hello": 2}, "unk_token": None}
SPECIAL = {"content": "<|im_start|>", "normalized": False, "lstrip": False, "rstrip": False}


def spec(**fields):
    return {"model": BPE, "normalizer": None, "pre_tokenizer": None, "added_tokens": [], **fields}


def test_the_longest_piece_or_added_token_bounds_a_plain_tokenizer():
    assert max_chars_per_token(spec()) == len("▁hello")
    assert max_chars_per_token(spec(added_tokens=[SPECIAL])) == len("<|im_start|>")


@pytest.mark.parametrize("normalizer, per_token", [
    ({"type": "NFD"}, 6),
    ({"type": "NFC"}, 6 * LONGEST_DECOMPOSITION),  # composing shortens the text the pieces cover
    ({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                          {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}, 6),
    ({"type": "Replace", "pattern": {"String": "  "}, "content": " "}, 12),
    ({"type": "Replace", "pattern": {"Regex": " +"}, "content": " "}, None),
    ({"type": "Replace", "pattern": {"String": "x"}, "content": ""}, None),
    ({"type": "Strip", "strip_left": True, "strip_right": True}, None),
    ({"type": "StripAccents"}, None),
    ({"type": "BertNormalizer"}, None),
])
def test_a_normalizer_that_may_shorten_text_widens_the_bound_or_removes_it(normalizer, per_token):
    assert max_chars_per_token(spec(normalizer=normalizer)) == per_token


def test_text_a_token_may_swallow_whole_leaves_no_bound():
    assert max_chars_per_token(spec(pre_tokenizer={"type": "Whitespace"})) is None  # drops whitespace
    removed = {"type": "Split", "pattern": {"Regex": "x"}, "behavior": "Removed", "invert": False}
    assert max_chars_per_token(spec(pre_tokenizer=removed)) is None
    assert max_chars_per_token(spec(pre_tokenizer={**removed, "behavior": "Isolated"})) == 6
    assert max_chars_per_token(spec(model={**BPE, "unk_token": "<unk>", "fuse_unk": True})) is None
    assert max_chars_per_token(spec(model={**BPE, "unk_token": "<unk>", "fuse_unk": True, "byte_fallback": True})) == 6
    assert max_chars_per_token(spec(model={"type": "WordPiece", "vocab": {"a": 0}, "unk_token": "[UNK]"})) is None
    assert max_chars_per_token(spec(added_tokens=[{**SPECIAL, "rstrip": True}])) is None  # eats the spaces after it


def test_the_longest_canonical_decomposition_is_what_nfc_may_compose():
    longest = max(len(unicodedata.normalize("NFD", chr(c))) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    assert longest == LONGEST_DECOMPOSITION


@pytest.fixture(scope="module", params=["llama3", "chatml"])
def tokenizer(request, tmp_path_factory) -> Tokenizer:
    out = tmp_path_factory.mktemp(request.param)
    write_tokenizer(out, request.param, 512, 1024)
    return Tokenizer.from_dir(out)


def adversarial_texts(tokenizer: Tokenizer) -> list[str]:
    """Texts that pack the most characters into each token: the longest pieces and added tokens, runs of one
    character, decomposed characters NFC composes, and random ones."""
    rng = random.Random(0)
    longest = max(tokenizer.backend.get_vocab(), key=len)
    added = "".join(t.content for t in tokenizer.backend.get_added_tokens_decoder().values())
    return [longest * 40, added * 20, unicodedata.normalize("NFD", "\u1f82") * 300, "\u1100\u1161\u11a8" * 300,
            " " * 3000, "a" * 3000, "\n" * 3000, *("".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(2000))
                                                  for _ in range(4))]


def test_the_floor_never_passes_the_real_count(tokenizer):
    assert tokenizer.chars_per_token is not None
    for text in adversarial_texts(tokenizer):
        assert len(tokenizer.encode(text, add_special_tokens=False)) >= tokenizer.min_tokens(text), text[:20]


def test_encode_gives_the_ids_of_the_library_encode(tokenizer):
    for text in ["The river flows.", "你好，世界 🙂", "<|im_start|>user\nhi<|im_end|>", *adversarial_texts(tokenizer)]:
        for special in (True, False):
            assert tokenizer.encode(text, special) == tokenizer.backend.encode(text, add_special_tokens=special).ids


def test_the_floor_is_tight_for_the_llama_tokenizer_longest_token(tmp_path):
    write_tokenizer(tmp_path, "llama3", 512, 1024)
    tokenizer = Tokenizer.from_dir(tmp_path)
    text = "<|start_header_id|>" * 50  # one added token, the longest, fifty times: exactly fifty tokens
    assert tokenizer.chars_per_token == len("<|start_header_id|>")
    assert tokenizer.min_tokens(text) == 50 == len(tokenizer.encode(text, add_special_tokens=False))


def test_a_panic_of_the_library_on_a_text_is_an_invalid_request(tokenizer, monkeypatch):
    class PanicException(BaseException):  # pyo3's, raised from the Rust library
        pass

    def panics(*args, **kwargs):
        raise PanicException("Onig: Regex search error: retry-limit-in-match over")

    monkeypatch.setattr(tokenizer, "backend", type("Backend", (), {"encode_batch_fast": staticmethod(panics)})())
    with pytest.raises(InvalidRequest, match="cannot split this text") as err:
        tokenizer.encode(" " * 100)
    assert err.value.code == "untokenizable_text"
