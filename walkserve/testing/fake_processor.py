"""The frontend half of the fake model: byte-level tokenizer, chat template, payload checks.

Token ids 0..255 are the bytes of UTF-8 text; ``EOS_ID`` (256) ends a
sequence. Torch-free, like every Processor.
"""

from __future__ import annotations

import codecs
import dataclasses
from typing import Any

from walkserve.core.array import ArrayData
from walkserve.core.context import check_prompt_floor
from walkserve.core.errors import InvalidRequest
from walkserve.core.params import Params
from walkserve.core.request import RequestSpec
from walkserve.core.sampling import SamplingParams
from walkserve.models.processor import Detokenizer, ModelCard, Processor

EOS_ID = 256
VOCAB_SIZE = 257
PROMPT_IDS = "prompt_token_ids"  # the input key the API reads the prompt length from


class ByteDetokenizer(Detokenizer):
    """UTF-8 bytes to text; an incomplete multi-byte character waits for its last byte."""

    def __init__(self, skip_special_tokens: bool = True):
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._skip = skip_special_tokens

    def push(self, token_ids: list[int]) -> str:
        out = []
        for token in token_ids:
            if token < 256:
                out.append(self._decoder.decode(bytes([token])))
            elif not self._skip:
                out.append(self._decoder.decode(b"", final=True) + "<|eos|>")
        return "".join(out)

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


class FakeParams(Params, frozen=True, tag="fake", forbid_unknown_fields=False):
    """What the routes pass the fake model; it reads ``voice`` and ``size`` and ignores any other field."""

    voice: str | None = None
    speed: float = 1.0
    size: tuple[int, int] | None = None  # (width, height)
    steps: int | None = None


class FakeProcessor(Processor):
    """Builds RequestSpecs for the fake model.

    Payload conventions (the ones the HTTP API sends):
    completion ``{"prompt": str}`` or ``{"prompt_token_ids": [int]}``;
    chat ``{"messages": [{"role", "content": [parts]}], "modalities": [...]}``
    where a part is ``{"type": "text", "text"}``, ``{"type": "image", "image":
    ArrayData}`` or ``{"type": "audio", "audio": ArrayData, "sample_rate"}``;
    speech ``{"input": str}``; image ``{"prompt": str, "images": [ArrayData]}``;
    generate ``{"inputs": {...}, "modalities": [...]}``. Settings (voice,
    speed, size) arrive in ``params``.
    """

    params_type = FakeParams

    def __init__(self, card: ModelCard):
        self._card = card

    def card(self) -> ModelCard:
        return self._card

    def tokenize(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def detokenizer(self, skip_special_tokens: bool = True) -> Detokenizer:
        return ByteDetokenizer(skip_special_tokens)

    def check_prompt_size(self, task: str, payload: dict[str, Any]) -> None:
        prompt = payload.get("prompt") if task == "completion" else None
        if isinstance(prompt, str):  # a token per UTF-8 byte: at least one per character
            served, what = self.served_context(self._card.max_context)
            check_prompt_floor(len(prompt), served, "prompt", what, f" ({len(prompt)} characters, at most 1 per token)")

    def build_request(
        self, task: str, payload: dict[str, Any], sampling: SamplingParams, params: FakeParams
    ) -> RequestSpec:
        builders = {
            "completion": self._completion,
            "chat": self._chat,
            "speech": self._speech,
            "image": self._image,
            "generate": self._generate,
        }
        if task not in builders:
            raise InvalidRequest(f"task {task!r} is not supported by {self._card.id}", param="task")
        inputs, modalities = builders[task](payload, params)
        self._check_modalities(modalities)
        prompt = inputs.get(PROMPT_IDS)
        if prompt is not None:
            field = {"chat": "messages", "speech": "input", "generate": "inputs"}.get(task, "prompt")
            length = prompt.numel if isinstance(prompt, ArrayData) else len(prompt)
            max_tokens = self.fit_max_tokens(length, self._card.max_context, sampling.max_tokens, field)
            sampling = dataclasses.replace(sampling, max_tokens=max_tokens)
        return RequestSpec(inputs=inputs, task=task, modalities=modalities, sampling=sampling, params=params)

    def _check_modalities(self, modalities: tuple[str, ...]) -> None:
        caps = self._card.capabilities
        if "audio" in modalities and not ({"speech", "audio_out"} & caps):
            raise InvalidRequest(f"model {self._card.id} cannot produce audio", param="modalities")
        if "image" in modalities and "images" not in caps:
            raise InvalidRequest(f"model {self._card.id} cannot produce images", param="modalities")

    def _ids(self, ids: list[int], param: str) -> dict[str, Any]:
        if any(not isinstance(t, int) or not 0 <= t < VOCAB_SIZE for t in ids):
            raise InvalidRequest(f"token ids must be in [0, {VOCAB_SIZE})", param=param)
        if not ids:
            raise InvalidRequest("the prompt is empty", param=param)
        return {PROMPT_IDS: ArrayData.from_list(ids, "int64")}

    def _completion(self, payload: dict, params: FakeParams) -> tuple[dict, tuple[str, ...]]:
        if "prompt_token_ids" in payload:
            return self._ids(list(payload["prompt_token_ids"]), "prompt"), ("text",)
        self.check_prompt_size("completion", payload)
        return self._ids(self.tokenize(str(payload.get("prompt", ""))), "prompt"), ("text",)

    def _chat(self, payload: dict, params: FakeParams) -> tuple[dict, tuple[str, ...]]:
        lines, images, audio = [], [], []
        for message in payload.get("messages", []):
            text = []
            for part in message["content"]:
                if part["type"] == "text":
                    text.append(part["text"])
                elif part["type"] == "image":
                    images.append(part["image"])
                    text.append("<|image|>")
                elif part["type"] == "audio":
                    audio.append(part["audio"])
                    text.append("<|audio|>")
            lines.append(f"<|{message['role']}|>{''.join(text)}\n")
        inputs = self._ids(self.tokenize("".join(lines) + "<|assistant|>"), "messages")
        if images:
            inputs["images"] = images
        if audio:
            inputs["audio"] = audio
        return inputs, tuple(payload.get("modalities") or ("text",))

    def _speech(self, payload: dict, params: FakeParams) -> tuple[dict, tuple[str, ...]]:
        return self._ids(self.tokenize(str(payload.get("input", ""))), "input"), ("audio",)

    def _image(self, payload: dict, params: FakeParams) -> tuple[dict, tuple[str, ...]]:
        inputs = self._ids(self.tokenize(str(payload.get("prompt", ""))), "prompt")
        if payload.get("images"):
            inputs["images"] = list(payload["images"])
        return inputs, ("image",)

    def _generate(self, payload: dict, params: FakeParams) -> tuple[dict, tuple[str, ...]]:
        inputs = dict(payload.get("inputs") or {})
        prompt = inputs.pop("prompt", None)
        if isinstance(prompt, str):
            inputs.update(self._ids(self.tokenize(prompt), "inputs.prompt"))
        elif isinstance(prompt, list):
            inputs.update(self._ids(prompt, "inputs.prompt"))
        elif PROMPT_IDS not in inputs:
            raise InvalidRequest("inputs.prompt (text or token ids) is required", param="inputs.prompt")
        modalities = tuple(payload.get("modalities") or ("text",))
        unknown = set(modalities) - {"text", "audio", "image", "latent"}
        if unknown:
            raise InvalidRequest(f"unknown modalities {sorted(unknown)}", param="modalities")
        return inputs, modalities
