"""OrpheusProcessor: speech requests -> Orpheus prompts (torch-free, runs in the API process).

Payloads (the API's conventions):
    task "speech":    {"input": text, "voice": name?}        (voice may also come in params)
    task "generate":  {"inputs": {"input" | "text": text, "voice": name?}, "modalities": ["audio"]}

The request is ``RequestSpec(inputs={"prompt_token_ids": int64 [N]}, modalities=("audio",))``
with END_OF_SPEECH and the model's end-of-sequence ids among the stop ids.
The card's ``default_sampling`` carries the model card's suggestion
(temperature 0.6, top_p 0.8, repetition_penalty 1.3) and a ~30 s ``max_tokens``;
the API applies it under whatever the client sets, the ~30 s bound beneath the
room left in the context (``sampling()`` gives the same values to in-process
callers). An explicit ``max_tokens`` must fit the context with the prompt;
None takes the room left (``core/context.py``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import msgspec

from walkserve.core.array import ArrayData
from walkserve.core.errors import InvalidRequest
from walkserve.core.params import Params
from walkserve.core.request import RequestSpec
from walkserve.core.sampling import SamplingParams
from walkserve.models.common.lm_config import LMConfig, checkpoint_eos_ids
from walkserve.models.common.text_walk import PROMPT_INPUT
from walkserve.models.orpheus.tokens import (
    DEFAULT_REPETITION_PENALTY,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_P,
    DEFAULT_VOICE,
    END_OF_SPEECH,
    FRAME_SAMPLES,
    FRAME_TOKENS,
    SAMPLE_RATE,
    VOICES,
    build_prompt_ids,
)
from walkserve.models.processor import ModelCard, Processor
from walkserve.models.tokenizer import Tokenizer

MAX_SPEECH_SECONDS = 30
# enough audio tokens for MAX_SPEECH_SECONDS of whole frames, plus the END_OF_SPEECH iteration
DEFAULT_MAX_TOKENS = FRAME_TOKENS * math.ceil(MAX_SPEECH_SECONDS * SAMPLE_RATE / FRAME_SAMPLES) + 1
DEFAULT_SAMPLING = {
    "temperature": DEFAULT_TEMPERATURE,
    "top_p": DEFAULT_TOP_P,
    "repetition_penalty": DEFAULT_REPETITION_PENALTY,
    "max_tokens": DEFAULT_MAX_TOKENS,
}
TASKS = ("speech", "generate")


class SpeechParams(Params, frozen=True, tag="orpheus"):
    """Orpheus's request parameters (the speech route fills them from its body)."""

    voice: str | None = None
    speed: Annotated[float, msgspec.Meta(ge=0.25, le=4.0)] = 1.0  # OpenAI's range; Orpheus speaks only at 1.0
    instructions: str | None = None


class OrpheusProcessor(Processor):
    """Builds Orpheus speech requests from text and a voice."""

    params_type = SpeechParams

    def __init__(
        self,
        lm_path: str | Path,
        model_id: str | None = None,
        voices: Sequence[str] | None = None,
        random_weights: bool = False,
    ):
        lm_path = Path(lm_path)
        self.config = LMConfig.from_file(lm_path)
        self.tokenizer = Tokenizer.from_dir(lm_path)
        self.voices = tuple(voices) if voices else VOICES
        self.stop_ids = tuple(dict.fromkeys((END_OF_SPEECH, *checkpoint_eos_ids(lm_path, self.config))))
        self._card = ModelCard(
            id=model_id or "orpheus",
            family="orpheus",
            capabilities=frozenset({"speech", "audio_out", "generate"}),
            max_context=self.config.max_position_embeddings,
            voices=self.voices,
            default_voice=DEFAULT_VOICE if DEFAULT_VOICE in self.voices else self.voices[0],
            sample_rate=SAMPLE_RATE,
            random_weights=random_weights or self.config.random_weights,
            description=f"Orpheus TTS ({self.config.num_hidden_layers}-layer Llama LM + SNAC 24 kHz)",
            default_sampling=dict(DEFAULT_SAMPLING),
        )

    def card(self) -> ModelCard:
        return self._card

    def sampling(self, **overrides: Any) -> SamplingParams:
        """The card's default sampling under ``overrides`` (what the API does for a client)."""
        return SamplingParams(**{**self._card.default_sampling, **overrides})

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=True)

    def build_request(
        self, task: str, payload: dict[str, Any], sampling: SamplingParams, params: SpeechParams
    ) -> RequestSpec:
        if task not in TASKS:
            raise InvalidRequest(f"{self._card.id} serves speech only, not task {task!r}", param="task")
        fields = _fields(task, payload)
        text, voice = _text(fields), self._voice(fields, params)
        _check_unsupported(payload, params)
        self.check_text_fits(text, self._card.max_context, "input")  # /v1/generate's text has no max_speech_chars
        ids = build_prompt_ids(self.tokenize, voice, text, self.voices)
        return RequestSpec(
            inputs={PROMPT_INPUT: ArrayData.from_list(ids, "int64")},
            task=task,
            modalities=("audio",),
            sampling=self._sampling_for(sampling, len(ids)),
            params=msgspec.structs.replace(params, voice=voice),
        )

    def _voice(self, fields: dict[str, Any], params: SpeechParams) -> str:
        voice = fields.get("voice") or params.voice or self._card.default_voice
        if not isinstance(voice, str) or voice not in self.voices:
            raise InvalidRequest(f"unknown voice {voice!r}; choose one of {', '.join(self.voices)}", param="voice")
        return voice

    def _sampling_for(self, sampling: SamplingParams, prompt_len: int) -> SamplingParams:
        """Stop ids merged in; max_tokens fitted to the context (None: the room left)."""
        max_tokens = self.fit_max_tokens(prompt_len, self._card.max_context, sampling.max_tokens, "input")
        extra = (END_OF_SPEECH,) if sampling.ignore_eos else self.stop_ids
        stops = tuple(dict.fromkeys((*sampling.stop_token_ids, *extra)))
        return dataclasses.replace(sampling, stop_token_ids=stops, max_tokens=max_tokens)


def _fields(task: str, payload: dict[str, Any]) -> dict[str, Any]:
    if task == "speech":
        return payload
    modalities = payload.get("modalities") or ["audio"]
    if list(modalities) != ["audio"]:
        raise InvalidRequest(f"Orpheus produces audio only; modalities {list(modalities)}", param="modalities")
    inputs = payload.get("inputs")
    if not isinstance(inputs, dict):
        raise InvalidRequest("inputs must be an object with the text to speak", param="inputs")
    return {**inputs, "input": inputs.get("input", inputs.get("text"))}


def _text(fields: dict[str, Any]) -> str:
    text = fields.get("input")
    if not isinstance(text, str) or not text.strip():
        raise InvalidRequest("input must be a non-empty string (the text to speak)", param="input")
    return text


def _check_unsupported(payload: dict[str, Any], params: SpeechParams) -> None:
    speed = payload.get("speed", params.speed)
    if speed not in (None, 1, 1.0):
        raise InvalidRequest(f"Orpheus speaks at one speed; speed {speed!r} is not supported", param="speed")
    if payload.get("instructions") or params.instructions:
        raise InvalidRequest(
            "Orpheus takes no instructions; put emotion tags such as <laugh> in the input", param="instructions"
        )
