"""The PaliGemma tokenizer (our SentencePiece BPE encoder against the sentencepiece library) and
openpi's prompt formats and state binning against hand-computed examples."""

from __future__ import annotations

import random

import numpy as np
import pytest
import sentencepiece

from walkserve.core.errors import ConfigError, InvalidRequest
from walkserve.models.pi0.prompt import clean_prompt, pi05_prompt, prompt_tokens, state_bins
from walkserve.models.pi0.spm_model import (
    UNUSED,
    USER_DEFINED,
    parse_model,
    read_model,
    write_model,
)
from walkserve.models.pi0.spm_tokenizer import SentencePieceTokenizer
from walkserve.models.pi0.tiny_tokenizer import BOS_ID, tiny_spm_model, write_tiny_tokenizer

TEXTS = [
    "Task: pick up the red cube, State: 192 0 255 255 -1 128 127 160;\nAction: ",
    "  hello  world ", "", "Zebra ünïcode 日本 🙂", "<image><image>pick<image> up", "a\tb\n\nc", "State: 0 1 2 3",
    "put the black bowl on the plate; stack the green block",
]


def _random_texts(n=60, seed=0):
    rng = random.Random(seed)
    alphabet = "abcdeilnoprstu ABCT:;,.-0123456789\n_é日<>image"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(n)]


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    return write_tiny_tokenizer(tmp_path_factory.mktemp("spm"))


def test_tiny_model_round_trips_through_the_reader(model_file):
    model = read_model(model_file)
    assert model == tiny_spm_model()
    assert model.bos_id == BOS_ID == 2 and model.byte_fallback and not model.add_dummy_prefix


def test_encoder_matches_sentencepiece(model_file):
    ours = SentencePieceTokenizer.from_file(model_file)
    ref = sentencepiece.SentencePieceProcessor(model_file=str(model_file))
    assert ours.vocab_size == ref.vocab_size() and ours.bos_id == ref.bos_id()
    for text in TEXTS + _random_texts():
        assert ours.encode(text, add_bos=True) == ref.encode(text, add_bos=True), repr(text)


@pytest.mark.parametrize("flags", [(True, True), (True, False), (False, True)], ids=["both", "prefix", "strip"])
def test_encoder_matches_sentencepiece_with_other_normaliser_flags(tmp_path, flags):
    """Dummy prefix and whitespace collapsing (off in PaliGemma's model), and an UNUSED piece that is split back."""
    base = tiny_spm_model()
    pieces = [(p, s, UNUSED if p == "▁the" else t) for p, s, t in base.pieces]
    model = type(base)(**{**base.__dict__, "pieces": tuple(pieces), "add_dummy_prefix": flags[0],
                          "remove_extra_whitespaces": flags[1]})
    path = write_model(model, tmp_path / "m.model")
    ours = SentencePieceTokenizer.from_file(path)
    ref = sentencepiece.SentencePieceProcessor(model_file=str(path))
    for text in TEXTS + _random_texts(30, seed=1) + ["pick up the  cube", " the the"]:
        assert ours.encode(text) == ref.encode(text), repr(text)


def test_reader_refuses_what_it_cannot_encode(tmp_path):
    with pytest.raises(ConfigError, match="not a SentencePiece model"):
        (tmp_path / "x.model").write_bytes(b"\xff\xff\xff")
        read_model(tmp_path / "x.model")
    unigram = type(tiny_spm_model())(**{**tiny_spm_model().__dict__, "model_type": 1})
    with pytest.raises(ConfigError, match="only BPE"):
        SentencePieceTokenizer(parse_model(write_model(unigram, tmp_path / "u.model").read_bytes()))
    assert any(t == USER_DEFINED for _, _, t in tiny_spm_model().pieces)


def test_state_bins_match_openpi():
    # hand-computed: bin = floor((x + 1) * 128), 255 at and above the last edge, -1 below -1
    state = np.array([0.5, -1.0, 0.999, 1.0, -1.2, 0.0, -0.004, 0.25, 3.0, -0.9921875], dtype=np.float32)
    assert state_bins(state) == [192, 0, 255, 255, -1, 128, 127, 160, 255, 1]


def test_pi05_prompt_matches_openpi():
    state = np.array([0.5, -1, 0.999, 1, -1.2, 0, -0.004, 0.25], dtype=np.float32)
    text = pi05_prompt(" Pick_up the Red cube\nnow ", state_bins(state))
    assert text == "Task: Pick up the Red cube now, State: 192 0 255 255 -1 128 127 160;\nAction: "
    assert clean_prompt("_a_\nB ") == " a  B"  # strip first, then replace (as openpi); case kept


def test_prompt_tokens_formats_and_limit(model_file):
    tok = SentencePieceTokenizer.from_file(model_file)
    state = np.zeros(3, dtype=np.float32)
    pi05 = prompt_tokens(tok, "pick_up", state, 64)
    assert pi05 == tok.encode("Task: pick up, State: 128 128 128;\nAction: ", add_bos=True)
    pi0 = prompt_tokens(tok, " pick_up\n", None, 64)
    assert pi0 == tok.encode("pick up", add_bos=True) + tok.encode("\n")
    with pytest.raises(InvalidRequest) as e:
        prompt_tokens(tok, "pick up the red cube " * 10, state, 48)
    assert e.value.param == "prompt" and "48" in str(e.value)
