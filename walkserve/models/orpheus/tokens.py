"""Orpheus TTS token ids, prompt format and the audio-token -> SNAC-code mapping (torch-free except frames_to_codes).

Audio tokens are ``<custom_token_N>`` = id ``128256 + N``. The i-th audio token
of a request's stream (i from 0, the first token after ``START_OF_SPEECH``)
carries the SNAC code ``id - 128266 - (i mod 7) * 4096``, in ``0..4095``. Seven
tokens make a frame (2048 samples at 24 kHz), spread over SNAC's levels::

    frame  t0 t1 t2 t3 t4 t5 t6
    level 0: [t0]   level 1: [t1, t4]   level 2: [t2, t3, t5, t6]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from walkserve.core.errors import InvalidRequest, WalkserveError

if TYPE_CHECKING:
    import torch

# Special ids (Llama-3 vocabulary + Orpheus' added tokens).
START_OF_TEXT = 128000  # Llama-3 <|begin_of_text|>; the tokenizer adds it by default
END_OF_TEXT = 128009
START_OF_SPEECH = 128257
END_OF_SPEECH = 128258  # the LM's stop token: speech ends here
START_OF_HUMAN = 128259
END_OF_HUMAN = 128260
START_OF_AI = 128261
END_OF_AI = 128262
PAD = 128263
CUSTOM_TOKEN_BASE = 128256  # <custom_token_N> = CUSTOM_TOKEN_BASE + N
AUDIO_CODE_BASE = 128266  # <custom_token_10>: code 0 at frame position 0

FRAME_TOKENS = 7
CODEBOOK_SIZE = 4096
FRAME_SAMPLES = 2048  # samples per frame at 24 kHz (one level-0 SNAC code)
SAMPLE_RATE = 24000
LEVEL_POSITIONS = ((0,), (1, 4), (2, 3, 5, 6))  # frame positions feeding SNAC level 0, 1, 2
AUDIO_TOKEN_RANGE = (
    AUDIO_CODE_BASE,
    AUDIO_CODE_BASE + FRAME_TOKENS * CODEBOOK_SIZE,
)  # [lo, hi) of audio ids
# every id allowed_ranges() can ever allow: the LM head computes logits for these only
EMITTABLE_RANGES = ((END_OF_SPEECH, END_OF_SPEECH + 1), AUDIO_TOKEN_RANGE)

PROMPT_PREFIX = (START_OF_HUMAN,)
PROMPT_SUFFIX = (END_OF_TEXT, END_OF_HUMAN, START_OF_AI, START_OF_SPEECH)

VOICES = ("tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe")
DEFAULT_VOICE = "tara"
DEFAULT_TEMPERATURE = 0.6
DEFAULT_TOP_P = 0.8
DEFAULT_REPETITION_PENALTY = 1.3  # >= 1.1 is needed for stable speech


class AudioTokenError(WalkserveError, ValueError):
    """An audio token id does not carry a valid code for its position in the stream; the message names both."""


def token_code(token_id: int, index: int) -> int:
    """The SNAC code of the ``index``-th audio token (no range check)."""
    return token_id - AUDIO_CODE_BASE - (index % FRAME_TOKENS) * CODEBOOK_SIZE


def code_token(code: int, index: int) -> int:
    """The token id that carries ``code`` at stream position ``index`` (inverse of ``token_code``)."""
    return AUDIO_CODE_BASE + (index % FRAME_TOKENS) * CODEBOOK_SIZE + code


def allowed_ranges(n_generated: int) -> list[tuple[int, int]]:
    """Token ids the LM may sample as generated token ``n_generated`` (from 0): half-open ``[lo, hi)`` ranges.

    The 4096 audio ids valid at stream position ``n_generated mod 7``, and
    END_OF_SPEECH. The decode node hands this to the KV engine as
    ``node_params["token_ranges"]``; every other id is masked before sampling, so
    whatever the weights, the codec only ever receives valid codes.
    """
    lo = AUDIO_CODE_BASE + (n_generated % FRAME_TOKENS) * CODEBOOK_SIZE
    return [(lo, lo + CODEBOOK_SIZE), (END_OF_SPEECH, END_OF_SPEECH + 1)]


def frames_to_codes(
    token_ids: Sequence[int] | torch.Tensor, first_index: int
) -> list[torch.Tensor]:
    """Audio token ids of whole frames -> SNAC codes ``[F], [2F], [4F]`` (int64, CPU).

    ``token_ids[k]`` is audio token number ``first_index + k`` of the stream;
    ``first_index`` must start a frame (a multiple of 7) and the ids must make
    whole frames. Every code must lie in ``0..4095`` for its position:
    otherwise AudioTokenError names the first offending position and id (no
    token is skipped, so frame alignment can never silently shift).
    """
    import torch  # here, so the constants import without torch (the API process reads them)

    ids = torch.as_tensor(token_ids, dtype=torch.int64).reshape(-1)  # ids: [7F]
    if first_index % FRAME_TOKENS or ids.numel() % FRAME_TOKENS:
        raise AudioTokenError(
            f"Orpheus audio tokens: {ids.numel()} tokens from index {first_index} are not whole "
            f"{FRAME_TOKENS}-token frames"
        )
    offsets = (
        torch.arange(ids.numel()) + first_index
    ) % FRAME_TOKENS * CODEBOOK_SIZE + AUDIO_CODE_BASE
    codes = ids - offsets  # codes: [7F]
    bad = ((codes < 0) | (codes >= CODEBOOK_SIZE)).nonzero()
    if bad.numel():
        k = int(bad[0, 0])
        lo = int(offsets[k])
        raise AudioTokenError(
            f"Orpheus audio token {first_index + k} (frame position {(first_index + k) % FRAME_TOKENS}) "
            f"has id {int(ids[k])}; expected an id in [{lo}, {lo + CODEBOOK_SIZE})"
        )
    frames = codes.view(-1, FRAME_TOKENS)  # frames: [F, 7]
    return [frames[:, list(positions)].reshape(-1) for positions in LEVEL_POSITIONS]


def build_prompt_ids(
    tokenize: Callable[[str], Sequence[int]],
    voice: str,
    text: str,
    voices: Sequence[str] | None = VOICES,
) -> list[int]:
    """``[START_OF_HUMAN] + tokenize(f"{voice}: {text}") + [END_OF_TEXT, END_OF_HUMAN, START_OF_AI, START_OF_SPEECH]``.

    ``tokenize`` is the tokenizer with its default special-token handling (so
    Llama-3's ``<|begin_of_text|>`` comes first inside). A voice outside
    ``voices`` (the card's eight by default; None accepts any name, e.g. for a
    custom fine-tune) is an InvalidRequest naming ``voice``.
    """
    if voices is not None and voice not in voices:
        raise InvalidRequest(
            f"unknown voice {voice!r}; choose one of {', '.join(VOICES)}", param="voice"
        )
    return [*PROMPT_PREFIX, *tokenize(f"{voice}: {text}"), *PROMPT_SUFFIX]
