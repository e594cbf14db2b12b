"""Audio token -> SNAC code mapping and the prompt format."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from walkserve.core.errors import InvalidRequest
from walkserve.models.orpheus import tokens as T
from walkserve.models.orpheus.tokens import AudioTokenError, build_prompt_ids, frames_to_codes


def stream_ids(codes: list[int], first_index: int = 0) -> list[int]:
    """Token ids for ``codes`` as written by the model card: <custom_token_N>, N = code + 10 + (i mod 7) * 4096."""
    return [128256 + c + 10 + ((first_index + k) % 7) * 4096 for k, c in enumerate(codes)]


def test_one_frame_maps_to_levels():
    codes = [100, 1, 2, 3, 4, 5, 6]
    ids = stream_ids(codes)
    assert ids[0] == 128366 and ids[1] == 128266 + 4096 + 1 and ids[6] == 128266 + 6 * 4096 + 6
    l0, l1, l2 = frames_to_codes(ids, 0)
    assert l0.tolist() == [100] and l1.tolist() == [1, 4] and l2.tolist() == [2, 3, 5, 6]
    assert all(c.dtype == torch.int64 for c in (l0, l1, l2))


def test_several_frames_from_a_later_index():
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 4096, (3, 7), generator=g)  # 3 frames
    ids = torch.tensor(stream_ids(codes.flatten().tolist(), first_index=14))
    l0, l1, l2 = frames_to_codes(ids, 14)
    assert l0.tolist() == codes[:, 0].tolist()
    assert l1.tolist() == codes[:, [1, 4]].flatten().tolist()
    assert l2.tolist() == codes[:, [2, 3, 5, 6]].flatten().tolist()
    assert [T.token_code(i, 14 + k) for k, i in enumerate(ids.tolist())] == codes.flatten().tolist()
    assert [T.code_token(c, 14 + k) for k, c in enumerate(codes.flatten().tolist())] == ids.tolist()


def test_extreme_codes_are_valid():
    ids = stream_ids([0, 4095, 0, 4095, 0, 4095, 0])
    assert frames_to_codes(ids, 7)[0].tolist() == [0]


@pytest.mark.parametrize(
    ("position", "bad_id"),
    [
        (0, 128266 - 1),  # code -1
        (3, 128266 + 3 * 4096 + 4096),  # code 4096
        (6, 128266 + 3 * 4096 + 5),  # a valid id for frame position 3, not 6
    ],
)
def test_out_of_range_code_names_the_token(position, bad_id):
    ids = stream_ids([5] * 14)
    ids[7 + position] = bad_id
    with pytest.raises(
        AudioTokenError, match=rf"audio token {7 + position} \(frame position {position}\)"
    ):
        frames_to_codes(ids, 0)


def test_non_audio_token_is_rejected():
    ids = stream_ids([5] * 7)
    ids[2] = T.END_OF_SPEECH
    with pytest.raises(AudioTokenError, match=f"has id {T.END_OF_SPEECH}"):
        frames_to_codes(ids, 0)


def test_partial_or_misaligned_frames_are_rejected():
    with pytest.raises(AudioTokenError, match="not whole 7-token frames"):
        frames_to_codes(stream_ids([1] * 8), 0)
    with pytest.raises(AudioTokenError, match="not whole 7-token frames"):
        frames_to_codes(stream_ids([1] * 7, 3), 3)


def test_prompt_ids():
    seen = []

    def tokenize(text):
        seen.append(text)
        return [128000, 11, 12]

    ids = build_prompt_ids(tokenize, "tara", "Hello there")
    assert seen == ["tara: Hello there"]
    assert ids == [128259, 128000, 11, 12, 128009, 128260, 128261, 128257]
    with pytest.raises(InvalidRequest, match="unknown voice 'bob'") as e:
        build_prompt_ids(tokenize, "bob", "hi")
    assert e.value.param == "voice"
    assert build_prompt_ids(tokenize, "bob", "hi", voices=None)[0] == 128259


def test_constants():
    assert T.VOICES == ("tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe")
    assert (T.DEFAULT_TEMPERATURE, T.DEFAULT_TOP_P, T.DEFAULT_REPETITION_PENALTY) == (0.6, 0.8, 1.3)
    assert (T.END_OF_SPEECH, T.START_OF_SPEECH, T.PAD, T.AUDIO_CODE_BASE) == (
        128258,
        128257,
        128263,
        128266,
    )
    assert T.AUDIO_TOKEN_RANGE == (128266, 128266 + 7 * 4096)


def test_tokens_and_emission_import_without_torch():
    code = (
        "import sys; import walkserve.models.orpheus.tokens, walkserve.models.orpheus.emission; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
