"""Tokenizer, sandboxed chat templates and the incremental detokenizer."""

from __future__ import annotations

import itertools
import json
import unicodedata

import jinja2
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from walkserve.core.errors import ConfigError
from walkserve.models.chat_template import ChatTemplate
from walkserve.models.tokenizer import Tokenizer

MESSAGES = [
    {"role": "system", "content": "You are brief."},
    {"role": "user", "content": "What is 2 + 2? 🙂"},
    {"role": "assistant", "content": "Four."},
    {"role": "user", "content": "  And in 日本語?  "},
]
TEXTS = [
    "The river ran quietly past the old mill.",
    "你好，世界。 日本語のテキスト。",
    "Rockets 🚀✨🙂 and flags 🇫🇷 with a family 👨‍👩‍👧 emoji.",
    "Ça va très bien, merci. Здравствуйте!",
    "mixed: abc😀def 漢字 1234 $5.99",
]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_encode_and_chat_template_match_transformers(arch, tiny_dirs):
    from transformers import AutoTokenizer

    ours, ref = Tokenizer.from_dir(tiny_dirs[arch]), AutoTokenizer.from_pretrained(tiny_dirs[arch])
    for text in TEXTS:
        assert ours.encode(text) == ref(text)["input_ids"]
        assert ours.encode(text, add_special_tokens=False) == ref(text, add_special_tokens=False)["input_ids"]
        assert ours.decode(ours.encode(text)) == ref.decode(ref(text)["input_ids"], skip_special_tokens=True)
    for gen_prompt in (True, False):
        want = ref.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=gen_prompt)
        assert ours.apply_chat_template(MESSAGES, add_generation_prompt=gen_prompt) == want


def test_special_token_ids_agree_with_config(tiny_dirs):
    for arch in ("llama", "qwen2", "qwen3"):
        tok = Tokenizer.from_dir(tiny_dirs[arch])
        config = json.loads((tiny_dirs[arch] / "config.json").read_text())
        assert tok.bos_token_id == config["bos_token_id"] if arch == "llama" else tok.bos_token is None
        assert tok.eos_token_id in config["eos_token_id"]
        assert max(tok.backend.get_vocab().values()) < config["vocab_size"]
    llama = Tokenizer.from_dir(tiny_dirs["llama"])
    assert llama.encode("hi")[0] == llama.bos_token_id


def test_sandbox_blocks_attribute_escapes():
    # An unsafe attribute is an undefined value: printing it shows nothing, using it raises SecurityError.
    assert ChatTemplate("[{{ messages.__class__ }}][{{ raise_exception.__globals__ }}]").render(MESSAGES) == "[][]"
    for source in ("{{ messages.__class__.__mro__ }}", "{{ ''.__class__.__mro__[1].__subclasses__() }}",
                   "{{ raise_exception.__globals__['json'] }}", "{{ messages.__class__() }}"):
        with pytest.raises(jinja2.exceptions.SecurityError):
            ChatTemplate(source).render(MESSAGES)
    with pytest.raises(jinja2.exceptions.SecurityError):  # immutable: no in-place mutation of inputs
        ChatTemplate("{{ messages.append(1) }}").render(MESSAGES)


def test_template_helpers():
    t = ChatTemplate("{{ messages[1] | tojson }}|{{ strftime_now('%Y') | length }}")
    text, year_len = t.render(MESSAGES).split("|")
    assert json.loads(text) == MESSAGES[1] and "🙂" in text  # tojson keeps non-ASCII
    assert year_len == "4"
    with pytest.raises(jinja2.TemplateError, match="no system"):
        ChatTemplate("{{ raise_exception('no system') }}").render(MESSAGES)
    loops = ChatTemplate("{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{{ m.role }},{% endfor %}")
    assert loops.render(MESSAGES) == "system,user,"


def test_chat_template_file_fallback_and_missing(tiny_dirs, tmp_path):
    import shutil

    path = shutil.copytree(tiny_dirs["qwen2"], tmp_path / "q")
    config = json.loads((path / "tokenizer_config.json").read_text())
    template = config.pop("chat_template")
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="no chat template"):
        Tokenizer.from_dir(path).apply_chat_template(MESSAGES)
    (path / "chat_template.jinja").write_text(template)
    assert Tokenizer.from_dir(path).apply_chat_template(MESSAGES).startswith("<|im_start|>system\n")


def _stream(tok: Tokenizer, ids: list[int], cuts: list[int], skip: bool = True) -> list[str]:
    d = tok.detokenizer(skip)
    bounds = sorted({c % (len(ids) + 1) for c in cuts} | {0, len(ids)})
    deltas = [d.push(ids[a:b]) for a, b in itertools.pairwise(bounds)]
    return [*deltas, d.flush()]


def test_detokenizer_actually_holds_back_split_characters(tiny_dirs):
    tok = Tokenizer.from_dir(tiny_dirs["llama"])
    ids = tok.encode("🚀 漢", add_special_tokens=False)
    alone = [tok.decode([i]) for i in ids]
    assert any("\ufffd" in s for s in alone)  # the byte-level BPE does split these characters
    d = tok.detokenizer()
    deltas = [d.push([i]) for i in ids]
    assert "" in deltas and all("\ufffd" not in s for s in deltas)
    assert "".join(deltas) + d.flush() == "🚀 漢"


@settings(max_examples=60, deadline=None)
@given(text_index=st.integers(0, len(TEXTS) - 1), cuts=st.lists(st.integers(0, 200), max_size=12),
       arch=st.sampled_from(["llama", "qwen2"]), special=st.booleans())
def test_detokenizer_deltas_concatenate_to_one_shot_decode(tiny_dirs, text_index, cuts, arch, special):
    tok = Tokenizer.from_dir(tiny_dirs[arch])
    ids = tok.encode(TEXTS[text_index], add_special_tokens=special)
    ids = ids + [tok.eos_token_id]
    for skip in (True, False):
        deltas = _stream(tok, ids, cuts, skip)
        assert "".join(deltas) == tok.decode(ids, skip_special_tokens=skip)
        assert all("\ufffd" not in s for s in deltas)  # never a broken character


@settings(max_examples=40, deadline=None)
@given(text=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40),
       cuts=st.lists(st.integers(0, 100), max_size=8))
@example(text="\u0fb9", cuts=[])  # NFC-unstable: the tokenizer reads it as U+0F90 U+0FB5
def test_detokenizer_on_arbitrary_unicode(tiny_dirs, text, cuts):
    tok = Tokenizer.from_dir(tiny_dirs["qwen3"])
    ids = tok.encode(text, add_special_tokens=False)
    deltas = _stream(tok, ids, cuts)
    assert "".join(deltas) == tok.decode(ids) == unicodedata.normalize("NFC", text)  # Qwen's tokenizer normalizes


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_token_bytes_match_transformers_pieces_and_rebuild_the_text(arch, tiny_dirs):
    """Each token's bytes (what logprobs report), pieces of split characters included."""
    from transformers import AutoTokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    ours, ref = Tokenizer.from_dir(tiny_dirs[arch]), AutoTokenizer.from_pretrained(tiny_dirs[arch])
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    split = 0
    for text in TEXTS:
        ids = ours.encode(text, add_special_tokens=False)
        pieces = [ours.token_bytes(i) for i in ids]
        assert pieces == [bytes(byte_of[c] for c in ref.convert_ids_to_tokens(i)) for i in ids]
        assert b"".join(pieces) == text.encode("utf-8")
        split += sum(1 for p in pieces if "\ufffd" in p.decode("utf-8", errors="replace"))
    assert split > 0, "the texts were meant to split some characters across tokens"
    special = ours.eos_token_id
    assert ours.token_bytes(special) == ours.eos_token.encode()


def test_sentencepiece_pieces_to_bytes():
    """Llama-2-style vocabularies: U+2581 is a space, ``<0xAB>`` pieces are single bytes."""
    from walkserve.models.tokenizer import _piece_bytes

    spec = {"type": "Sequence", "decoders": [{"type": "Replace"}, {"type": "ByteFallback"}, {"type": "Fuse"},
                                             {"type": "Strip"}]}
    piece = _piece_bytes(spec)
    assert piece("\u2581Hello") == b" Hello" and piece("<0xE4>") == b"\xe4" and piece("<0xZZ>") == b"<0xZZ>"
    assert b"".join(piece(p) for p in ["\u2581", "<0xE4>", "<0xBD>", "<0xA0>", "ok"]) == " 你ok".encode()
