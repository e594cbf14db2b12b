"""The speech path's rules as data (torch-free): voices, what each sampler may draw, what the talker hears next.

Sampling (the model card's defaults; ``transformers`` ``generate`` uses the same):

    talker, code 0:      T 0.9, top_k 50, top_p 1.0, repetition penalty 1.05 over the code-0 ids it
                         generated; ids [V - 1024, V) suppressed except codec EOS; stops on codec EOS
    code predictor:      T 1.0, top_k 50, top_p 0.8, no penalty; step g draws from block g only

``temperature 0`` makes a sampler greedy. transformers applies the 1.05
penalty even when greedy, so equality with it needs repetition_penalty 1.0.

The trailing-text queue (what decode step i adds to the talker's input)::

    step i < n - 1:                 projected thinker token i + 1    (token 0 sits in the prefix)
    step i = n - 1 after the end:   tts_eos, once
    later:                          tts_pad
    otherwise (token i + 1 not yet there, thinker still running): wait

n counts the thinker tokens the talker speaks: every generated token but a
final EOS (``<|im_end|>``). transformers never embeds the last generated token,
so a thinker stopped by max_tokens loses its last token there; we speak it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from walkserve.core.errors import InvalidRequest
from walkserve.core.sampling import SamplingParams

DEFAULT_SPEAKER = "ethan"
SUPPRESSED_TAIL = 1024  # the top 1024 talker ids are control codes, never drawn (except codec EOS)
ASSISTANT_PREFIX = 9  # talker positions of the assistant turn before the first frame
PREFILL_HEAD = 3  # of them, known from the prompt alone (<|im_start|> assistant \n); the other 6 need token 0

TALKER_SAMPLING = SamplingParams(temperature=0.9, top_k=50, top_p=1.0, repetition_penalty=1.05)
PREDICTOR_SAMPLING = SamplingParams(temperature=1.0, top_k=50, top_p=0.8)
GREEDY = SamplingParams(temperature=0.0)


def speaker_id(speakers: Mapping[str, int], name: str | None) -> int:
    """The codec id of voice ``name`` (case-insensitive; None: the default, Ethan).

    Raises InvalidRequest (param ``audio.voice``) naming the checkpoint's voices.
    """
    key = (name or DEFAULT_SPEAKER).lower()
    if key not in speakers:
        voices = ", ".join(k.capitalize() for k in speakers)
        raise InvalidRequest(f"unknown voice {name!r}; this model speaks with: {voices}", param="audio.voice")
    return speakers[key]


def voices(speakers: Mapping[str, int]) -> list[str]:
    """The voice names, capitalised as the model card writes them, default first."""
    names = [k.capitalize() for k in speakers]
    default = DEFAULT_SPEAKER.capitalize()
    return sorted(names, key=lambda n: n != default)


def code0_ranges(vocab_size: int, codec_eos: int) -> list[tuple[int, int]]:
    """The ids the talker may draw as code 0: ``[0, V - 1024)`` and codec EOS."""
    ranges = [(0, vocab_size - SUPPRESSED_TAIL)]
    if not 0 <= codec_eos < vocab_size - SUPPRESSED_TAIL:
        ranges.append((codec_eos, codec_eos + 1))
    return ranges


def predictor_ranges(step: int, codebook_size: int) -> list[tuple[int, int]]:
    """The stacked ids the code predictor may draw at depth ``step`` (0..14, giving code ``step + 1``)."""
    return [(step * codebook_size, (step + 1) * codebook_size)]


def node_sampling(request: SamplingParams, node: SamplingParams, override: Mapping | None = None) -> SamplingParams:
    """A node's sampling: the card default, greedy (no penalty) when the request asks temperature 0, or ``override``.

    ``override`` is the node's entry of the request's documented extension
    field (e.g. ``{"temperature": 0.7, "top_k": 20}``); its keys replace the
    default's and are validated by SamplingParams.
    """
    base = GREEDY if request.greedy else node
    if not override:
        return base
    try:
        return dataclasses.replace(base, **dict(override))
    except TypeError as e:
        raise InvalidRequest(f"per-node sampling: {e}", param="sampling") from None


@dataclass(frozen=True)
class TrailingText:
    """What decode step ``step`` adds to the talker input: ("token", k), ("eos",), ("pad",) or ("wait",)."""

    kind: str
    token: int = -1


def trailing_text(step: int, n_tokens: int, thinker_ended: bool) -> TrailingText:
    """The trailing-text rule (module docstring) for talker decode ``step`` (0-based).

    ``n_tokens``: thinker tokens known so far that the talker speaks (EOS not
    counted); ``thinker_ended``: no more will come.
    """
    k = step + 1
    if k < n_tokens:
        return TrailingText("token", k)
    if not thinker_ended:
        return TrailingText("wait")
    return TrailingText("eos") if k == max(n_tokens, 1) else TrailingText("pad")


def spoken_tokens(generated: list[int], eos_ids: tuple[int, ...], drop_unfinished_last: bool = False) -> list[int]:
    """The generated thinker tokens the talker speaks: all but a final EOS.

    ``drop_unfinished_last`` reproduces transformers: when the thinker stopped
    without EOS (max_tokens), its last token is dropped too.
    """
    if generated and generated[-1] in eos_ids:
        return generated[:-1]
    return generated[:-1] if drop_unfinished_last else list(generated)


def user_positions(prompt_ids: Sequence[int], im_start: int, user: int) -> list[int]:
    """Prompt positions the talker hears: those whose latest ``<|im_start|>`` opens a user turn.

    Every user turn, ``<|im_start|>user\\n ... <|im_end|>\\n`` included, in order;
    system and earlier assistant turns are dropped (as transformers does).
    """
    out, role = [], None
    for i, token in enumerate(prompt_ids):
        if token == im_start:
            role = prompt_ids[i + 1] if i + 1 < len(prompt_ids) else None
        if role == user:
            out.append(i)
    return out


def assistant_start(prompt_ids: Sequence[int], im_start: int, assistant: int) -> int:
    """Index of the last ``<|im_start|>assistant`` of the prompt (the turn being answered)."""
    for i in range(len(prompt_ids) - 2, -1, -1):
        if prompt_ids[i] == im_start and prompt_ids[i + 1] == assistant:
            return i
    raise InvalidRequest("the prompt has no <|im_start|>assistant turn to speak", param="messages")
