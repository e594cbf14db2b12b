"""Qwen3OmniProcessor: chat, completion and native requests for the thinker (torch-free, the API process).

    chat        messages (text, image, audio, video parts) -> the checkpoint's chat template -> ids
    completion  prompt (text or ids) as given, no template, text only
    generate    inputs.prompt (one user turn, after the media inputs image* / audio* / video*, templated)
                or inputs.prompt_token_ids (as given)

then the media become encoder inputs (``media_inputs``), the placeholders are
expanded and positioned (``thinker_request``), and the prompt is cut into the
prefill walks' inputs (``prompt_pieces``). Messages are used as given: no
system prompt is added. ``modalities`` ["text", "audio"] (a checkpoint with a
talker, ``speech``) adds the talker's inputs (``speech_request``) and per-node
sampling; on a thinker-only checkpoint it is a 400 naming ``modalities``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import msgspec
from jinja2 import TemplateError

from walkserve.core.array import ArrayData
from walkserve.core.errors import ConfigError, InvalidRequest
from walkserve.core.params import Params
from walkserve.core.request import RequestSpec
from walkserve.core.sampling import SamplingParams
from walkserve.models.common.lm_config import checkpoint_eos_ids
from walkserve.models.processor import ModelCard, TokenizedProcessor
from walkserve.models.qwen3_omni.config import Qwen3OmniConfig
from walkserve.models.qwen3_omni.speech.config import SpeechConfig
from walkserve.models.qwen3_omni.speech.request import max_frames, speech_inputs, speech_sampling
from walkserve.models.qwen3_omni.speech.rules import voices
from walkserve.models.qwen3_omni.thinker.audio_features import HOP, SAMPLE_RATE
from walkserve.models.qwen3_omni.thinker.image_processor import VisionPreprocess
from walkserve.models.qwen3_omni.thinker.media_inputs import (
    MediaInputs,
    MediaSettings,
    convert_messages,
    media_from_inputs,
)
from walkserve.models.qwen3_omni.thinker.prompt import render_chat
from walkserve.models.qwen3_omni.thinker.prompt_pieces import request_inputs
from walkserve.models.qwen3_omni.thinker.request import ThinkerRequest, thinker_request
from walkserve.models.qwen3_omni.tokenizer_files import load_tokenizer

# the system prompt the model card recommends for speech output (the server never adds it)
RECOMMENDED_SYSTEM_PROMPT = ("You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of "
                             "perceiving auditory and visual inputs, as well as generating text and speech.")


class OmniParams(Params, frozen=True, tag="qwen3_omni"):
    """Qwen3-Omni's request parameters (a spoken request's ``max_audio_frames`` is filled by the processor)."""

    add_generation_prompt: bool = True  # chat: end the rendered template with the assistant's turn opening
    voice: str | None = None  # spoken answers: Ethan (default), Chelsie, Aiden (case-insensitive)
    node_sampling: dict[str, dict[str, Any]] | None = None  # spoken answers: {"thinker"|"talker"|"code_predictor": {...}}
    max_audio_frames: int | None = None  # spoken answers: the talker's bound (12.5 frames per second)
    codec_frames: bool = False  # /v1/generate with audio out: also stream each frame's 16 codes (modality latent)


class Qwen3OmniProcessor(TokenizedProcessor):
    """Turns payloads into ``RequestSpec``s whose inputs the thinker's state machine walks (``graph.py``)."""

    params_type = OmniParams

    def __init__(self, path: str | Path, model_id: str | None = None, speech: SpeechConfig | None = None):
        path = Path(path)
        self.speech = speech
        self.config = Qwen3OmniConfig.from_file(path)
        self.tokenizer = load_tokenizer(path)
        self.eos_token_ids = tuple(dict.fromkeys((self.config.tokens.im_end_token_id, *_eos_ids(path))))
        c = self.config
        self.media = MediaSettings(
            image=VisionPreprocess.from_checkpoint(path) if c.vision else VisionPreprocess(),
            video=VisionPreprocess.from_checkpoint(path, video=True),
            has_audio=c.audio is not None, has_vision=c.vision is not None,
            n_mels=c.audio.num_mel_bins if c.audio else 128)
        caps = {"completions", "chat", "generate", "logprobs"}
        caps |= {"audio_in"} if c.audio else set()
        caps |= {"image_in", "video_in"} if c.vision else set()
        caps |= {"audio_out"} if speech else set()
        parts = [n for n, m in (("audio", c.audio), ("vision", c.vision)) if m is not None]
        self._card = ModelCard(
            id=model_id or path.name, family="qwen3-omni", capabilities=frozenset(caps),
            max_context=c.text.max_position_embeddings, random_weights=c.random_weights,
            voices=tuple(voices(speech.speakers)) if speech else (),
            default_voice=voices(speech.speakers)[0] if speech else None,
            sample_rate=speech.code2wav.sampling_rate if speech else None,
            audio_window_s=c.audio.n_window_infer * HOP / SAMPLE_RATE if c.audio else None,
            description=f"Qwen3-Omni thinker ({c.text.num_hidden_layers} MoE layers, {c.text.num_experts} experts"
                        f"{', ' + ' + '.join(parts) + ' encoders' if parts else ''}; "
                        f"{'text and speech out' if speech else 'text out'})")

    def card(self) -> ModelCard:
        return self._card

    def build_request(self, task: str, payload: dict[str, Any], sampling: SamplingParams,
                      params: OmniParams) -> RequestSpec:
        speak = self._speaks(payload)
        if sampling.prompt_logprobs is not None:
            raise InvalidRequest("prompt logprobs (echo with logprobs) are not supported by Qwen3-Omni", param="echo")
        request, field = self.thinker_request(task, payload, params)
        n = len(request.input_ids)
        max_tokens = self.fit_max_tokens(n, self.config.text.max_position_embeddings, sampling.max_tokens, field)
        sampling = self._with_stop_ids(dataclasses.replace(sampling, max_tokens=max_tokens))
        inputs = request_inputs(request, self.config.tokens, merge=not speak)
        if not speak:
            return RequestSpec(inputs=inputs, task=task, modalities=("text",), sampling=sampling, params=params)
        return self._spoken(request, inputs, task, sampling, params)

    def _speaks(self, payload: dict[str, Any]) -> bool:
        modalities = list(payload.get("modalities") or ["text"])
        if modalities == ["text"]:
            return False
        if sorted(modalities) != ["audio", "text"]:
            raise InvalidRequest(f"modalities must be ['text'] or ['text', 'audio'], not {modalities}",
                                 param="modalities")
        if self.speech is None:
            raise InvalidRequest("this Qwen3-Omni checkpoint has no talker and Code2Wav (a thinker-only "
                                 "checkpoint): it answers with text only", param="modalities")
        return True

    def _spoken(self, request: ThinkerRequest, inputs: dict[str, Any], task: str, sampling: SamplingParams,
                params: OmniParams) -> RequestSpec:
        assert self.speech is not None
        if sampling.logprobs is not None:
            raise InvalidRequest("logprobs are not served with spoken answers", param="logprobs")
        if sampling.max_tokens < 2:
            raise InvalidRequest("a spoken answer needs max_tokens >= 2", param="max_tokens")
        inputs.update(speech_inputs(request, inputs, self.config, self.speech, params.voice))
        return RequestSpec(inputs=inputs, task=task, modalities=("text", "audio"), sampling=sampling,
                           params=msgspec.structs.replace(params, max_audio_frames=max_frames(params.max_audio_frames)),
                           node_sampling=speech_sampling(sampling, params.node_sampling))

    def thinker_request(self, task: str, payload: dict[str, Any], params: OmniParams) -> tuple[ThinkerRequest, str]:
        """The prompt as the thinker takes it (expanded ids, positions, encoder inputs) and the payload field
        it came from."""
        if task == "chat":
            (ids, media), field = self._chat(payload.get("messages"), params), "messages"
        elif task == "completion":
            ids, media, field = self._completion(payload), MediaInputs(), "prompt"
        elif task == "generate":
            (ids, media), field = self._generate(payload.get("inputs"), params), "inputs"
        else:
            raise InvalidRequest(f"{self._card.id} does not serve task {task!r}", param="task")
        if len(ids) < 2:
            raise InvalidRequest("the prompt needs at least two tokens", param=field)
        try:
            return thinker_request(ids, self.config, media.audio, media.images, media.videos), field
        except ValueError as e:  # placeholders and media disagree (a prompt given as ids with media)
            raise InvalidRequest(str(e), param=field) from None

    def _chat(self, messages: Any, params: OmniParams) -> tuple[list[int], MediaInputs]:
        media = convert_messages(messages, self.media)
        return self._render(media.messages, params.add_generation_prompt), media

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool, field: str = "messages") -> list[int]:
        try:
            text = render_chat(self.tokenizer, messages, add_generation_prompt=add_generation_prompt)
        except (ConfigError, TemplateError, ValueError) as e:
            raise InvalidRequest(f"chat template: {e}", param="messages") from None
        self.check_text_fits(text, self.config.text.max_position_embeddings, field)  # placeholders only grow
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _completion(self, payload: dict[str, Any]) -> list[int]:
        prompt, token_ids = payload.get("prompt"), payload.get("prompt_token_ids")
        if prompt is not None and token_ids is not None:
            raise InvalidRequest("give either prompt or prompt_token_ids, not both", param="prompt")
        if token_ids is not None or isinstance(prompt, list):
            return self._valid_ids(token_ids if token_ids is not None else prompt)
        if not isinstance(prompt, str) or not prompt:
            raise InvalidRequest("prompt must be a non-empty string", param="prompt")
        self.check_text_fits(prompt, self.config.text.max_position_embeddings, "prompt")
        return self.tokenize(prompt)

    def _generate(self, inputs: Any, params: OmniParams) -> tuple[list[int], MediaInputs]:
        if not isinstance(inputs, dict):
            raise InvalidRequest("inputs must be an object with prompt or prompt_token_ids", param="inputs")
        parts, media = media_from_inputs(inputs, self.media)
        known = {"prompt", "prompt_token_ids"}
        unknown = [k for k in inputs if k not in known and not k.startswith(("image", "audio", "video"))]
        if unknown:
            raise InvalidRequest(f"unknown input {unknown[0]!r} (prompt or prompt_token_ids, and media inputs named "
                                 f"image*, audio*, video*)", param=f"inputs.{unknown[0]}")
        if "prompt_token_ids" in inputs:
            ids = inputs["prompt_token_ids"]
            ids = ids.tolist() if isinstance(ids, ArrayData) else ids
            return self._valid_ids(ids, "inputs.prompt_token_ids"), media
        prompt = inputs.get("prompt")
        if not isinstance(prompt, str):
            raise InvalidRequest("inputs.prompt must be a string (the user's turn)", param="inputs.prompt")
        turn = [{"role": "user", "content": [*parts, {"type": "text", "text": prompt}]}]
        return self._render(turn, params.add_generation_prompt, "inputs"), media

    def _valid_ids(self, token_ids: Any, param: str = "prompt_token_ids") -> list[int]:
        vocab = self.config.text.vocab_size
        if not isinstance(token_ids, list) or not token_ids:
            raise InvalidRequest("prompt_token_ids must be a non-empty list of integers", param=param)
        for t in token_ids:
            if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab:
                raise InvalidRequest(f"{t!r} is not a token id in [0, {vocab})", param=param)
        return list(token_ids)

    def _with_stop_ids(self, sampling: SamplingParams) -> SamplingParams:
        vocab = self.config.text.vocab_size
        bad = [t for t, _ in sampling.logit_bias if t >= vocab]
        if bad:
            raise InvalidRequest(f"logit_bias names token id {bad[0]}; the vocabulary has {vocab} ids", param="logit_bias")
        if sampling.ignore_eos:
            return sampling
        return dataclasses.replace(sampling, stop_token_ids=tuple(dict.fromkeys((*sampling.stop_token_ids,
                                                                                  *self.eos_token_ids))))


def _eos_ids(path: Path) -> tuple[int, ...]:
    """generation_config.json's eos ids (config.json's thinker has none of its own)."""

    class _NoIds:
        eos_token_ids: tuple[int, ...] = ()

    return checkpoint_eos_ids(path, _NoIds())  # type: ignore[arg-type]
