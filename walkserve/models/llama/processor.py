"""TextLMProcessor: completion and chat requests for a text LM (torch-free, runs in the API process)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from jinja2 import TemplateError

from walkserve.core.array import ArrayData
from walkserve.core.errors import ConfigError, InvalidRequest
from walkserve.core.params import Params
from walkserve.core.request import RequestSpec
from walkserve.core.sampling import SamplingParams
from walkserve.models.common.lm_config import LMConfig, checkpoint_eos_ids
from walkserve.models.llama.graph import PROMPT_INPUT
from walkserve.models.processor import ModelCard, TokenizedProcessor
from walkserve.models.tokenizer import Tokenizer


class TextParams(Params, frozen=True, tag="text"):
    """A text LM's request parameters (Llama, Qwen2, Qwen3; BAGEL's and Qwen3-Omni's text side read theirs)."""

    add_generation_prompt: bool = True  # chat: end the rendered template with the assistant's turn opening


class TextLMProcessor(TokenizedProcessor):
    """Turns ``completion`` / ``chat`` / ``generate`` payloads into ``RequestSpec(inputs={"prompt_token_ids": int64 [N]})``.

    ``generate`` is the native route's task: ``{"inputs": {"prompt": str} or
    {"prompt_token_ids": [int] or int ArrayData [N]}, "modalities": ["text"]}``.

    ``sampling.max_tokens`` must fit the context with the prompt; None takes the
    room left (``core/context.py``).
    The model's end-of-sequence ids (config.json and generation_config.json)
    are merged into ``sampling.stop_token_ids`` unless ``sampling.ignore_eos``.
    ``random_weights`` is also taken from the checkpoint's marker (tiny checkpoints).
    """

    params_type = TextParams
    add_special_tokens = True  # a completion prompt starts with BOS

    def __init__(
        self,
        path: str | Path,
        model_id: str | None = None,
        family: str | None = None,
        random_weights: bool = False,
    ):
        path = Path(path)
        self.config = LMConfig.from_file(path)
        self.tokenizer = Tokenizer.from_dir(path)
        self.eos_token_ids = checkpoint_eos_ids(path, self.config)
        self._card = ModelCard(
            id=model_id or path.name,
            family=family or self.config.family,
            capabilities=frozenset({"completions", "chat", "generate", "logprobs"}),
            max_context=self.config.max_position_embeddings,
            random_weights=random_weights or self.config.random_weights,
            description=f"{self.config.architecture} ({self.config.num_hidden_layers} layers)",
        )

    def card(self) -> ModelCard:
        return self._card

    def check_prompt_size(self, task: str, payload: dict[str, Any]) -> None:
        """A completion's or a native generate's prompt, text or ids, that cannot fit (a chat's must be
        rendered first: ``_chat_ids`` checks it then)."""
        if task == "completion":
            self._check_prompt(payload.get("prompt", payload.get("prompt_token_ids")), "prompt")
        elif task == "generate" and isinstance(payload.get("inputs"), dict):
            inputs = payload["inputs"]
            self._check_prompt(inputs.get("prompt", inputs.get("prompt_token_ids")), "inputs")

    def _check_prompt(self, prompt: Any, field: str) -> None:
        """A text (by its length: ``check_text_fits``) or token ids (by their count) that cannot fit."""
        context = self.config.max_position_embeddings
        if isinstance(prompt, str):
            self.check_text_fits(prompt, context, field)
        elif isinstance(prompt, (list, ArrayData)):
            count = prompt.numel if isinstance(prompt, ArrayData) else len(prompt)
            self.fit_max_tokens(count, context, None, field)

    def build_request(
        self, task: str, payload: dict[str, Any], sampling: SamplingParams, params: TextParams
    ) -> RequestSpec:
        if task == "completion":
            ids, field = self._completion_ids(payload), "prompt"
        elif task == "chat":
            ids, field = self._chat_ids(payload, params), "messages"
        elif task == "generate":
            ids, field = self._generate_ids(payload), "inputs"
        else:
            raise InvalidRequest(f"{self._card.id} does not serve task {task!r}", param="task")
        if not ids:
            raise InvalidRequest("the prompt has no tokens", param=field)
        max_tokens = self.fit_max_tokens(len(ids), self.config.max_position_embeddings, sampling.max_tokens, field)
        self._check_token_ids(sampling)
        return RequestSpec(
            inputs={PROMPT_INPUT: ArrayData.from_list(ids, "int64")},
            task=task,
            modalities=("text",),
            sampling=self._with_stop_ids(dataclasses.replace(sampling, max_tokens=max_tokens)),
            params=params,
        )

    def _completion_ids(self, payload: dict[str, Any], field: str = "prompt") -> list[int]:
        prompt, token_ids = payload.get("prompt"), payload.get("prompt_token_ids")
        if prompt is not None and token_ids is not None:
            raise InvalidRequest("give either prompt or prompt_token_ids, not both", param="prompt")
        self._check_prompt(prompt if token_ids is None else token_ids, field)
        if token_ids is not None:
            return self._valid_ids(token_ids)
        if isinstance(prompt, list):  # OpenAI also accepts a prompt given as token ids
            return self._valid_ids(prompt)
        if not isinstance(prompt, str):
            raise InvalidRequest("prompt must be a string", param="prompt")
        if not prompt:
            raise InvalidRequest("prompt is empty", param="prompt")
        return self.tokenize(prompt)

    def _generate_ids(self, payload: dict[str, Any]) -> list[int]:
        modalities = list(payload.get("modalities") or ["text"])
        if modalities != ["text"]:
            raise InvalidRequest(f"{self._card.id} produces text only, not modalities {modalities}", param="modalities")
        inputs = payload.get("inputs")
        if not isinstance(inputs, dict):
            raise InvalidRequest("inputs must be an object with prompt or prompt_token_ids", param="inputs")
        unknown = sorted(set(inputs) - {"prompt", "prompt_token_ids"})
        if unknown:
            raise InvalidRequest(f"a text LM takes inputs prompt or prompt_token_ids, not {unknown[0]!r}",
                                 param=f"inputs.{unknown[0]}")
        ids = inputs.get("prompt_token_ids")
        if isinstance(ids, ArrayData):
            if not ids.dtype.startswith(("int", "uint")) or len(ids.shape) != 1:
                raise InvalidRequest(f"prompt_token_ids must be a 1-D integer array, got {ids.dtype} {list(ids.shape)}",
                                     param="inputs.prompt_token_ids")
            inputs = {**inputs, "prompt_token_ids": [int(t) for t in ids.tolist()]}
        return self._completion_ids(inputs, "inputs")

    def _valid_ids(self, token_ids: Any) -> list[int]:
        vocab = self.config.vocab_size
        if not isinstance(token_ids, list) or not token_ids:
            raise InvalidRequest("prompt_token_ids must be a non-empty list of integers", param="prompt_token_ids")
        for t in token_ids:
            if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab:
                raise InvalidRequest(f"prompt_token_ids: {t!r} is not a token id in [0, {vocab})",
                                     param="prompt_token_ids")
        return list(token_ids)

    def _chat_ids(self, payload: dict[str, Any], params: TextParams) -> list[int]:
        messages = _flatten_messages(payload.get("messages"))
        try:
            text = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=params.add_generation_prompt
            )
        except ConfigError as e:
            raise InvalidRequest(f"{self._card.id}: {e}", param="messages") from None
        except TemplateError as e:
            raise InvalidRequest(f"chat template: {e}", param="messages") from None
        self.check_text_fits(text, self.config.max_position_embeddings, "messages")  # the rendered text, not the
        return self.tokenizer.encode(text, add_special_tokens=False)  # messages: a template may trim them

    def _check_token_ids(self, sampling: SamplingParams) -> None:
        vocab = self.config.vocab_size
        unknown = [t for t, _ in sampling.logit_bias if t >= vocab]
        if unknown:
            raise InvalidRequest(f"logit_bias names token id {unknown[0]}; the vocabulary has {vocab} ids", param="logit_bias")

    def _with_stop_ids(self, sampling: SamplingParams) -> SamplingParams:
        if sampling.ignore_eos:
            return sampling
        merged = tuple(dict.fromkeys((*sampling.stop_token_ids, *self.eos_token_ids)))
        return dataclasses.replace(sampling, stop_token_ids=merged)


def _flatten_messages(messages: Any) -> list[dict[str, Any]]:
    """Validate chat messages; content parts [{"type": "text", "text": ...}] are joined into one string."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise InvalidRequest(f"messages[{i}] must be an object with a string role", param="messages")
        out.append({**m, "content": _content_text(m.get("content"), i)})
    return out


def _content_text(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if not isinstance(content, list):
        raise InvalidRequest(f"messages[{i}].content must be a string or a list of parts", param="messages")
    texts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise InvalidRequest(f"messages[{i}]: content part {kind!r} is not supported (text only)",
                                 param="messages")
        texts.append(part["text"])
    return "\n".join(texts)
