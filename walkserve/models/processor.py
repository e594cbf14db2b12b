"""The frontend side of a model: from API payloads to RequestSpec, from outputs to text/audio.

Torch-free: it runs in the API server process.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from walkserve.core.context import check_prompt_floor, max_new_tokens
from walkserve.core.params import Params, parse_params
from walkserve.core.request import RequestSpec
from walkserve.core.sampling import SamplingParams

DEFAULT_MAX_TOKENS = SamplingParams.__dataclass_fields__["max_tokens"].default

# Capabilities a model card may list; the API answers 400 for routes whose capability is missing.
CAPABILITIES = ("completions", "chat", "speech", "audio_out", "image_in", "audio_in", "video_in", "images", "image_edit",
                "generate", "act", "encode", "predict", "rollout", "plan", "embeddings")


@dataclass(frozen=True)
class ModelCard:
    """What the API tells clients about the served model (``/v1/models``) and what it checks against."""

    id: str
    family: str
    capabilities: frozenset[str]
    max_context: int = 4096
    voices: tuple[str, ...] = ()
    default_voice: str | None = None
    sample_rate: int | None = None  # audio output sample rate
    audio_window_s: float | None = None  # input audio: seconds per audio-encoder window (final once heard whole)
    random_weights: bool = False  # true for the embedded tiny demo checkpoints
    description: str = ""
    default_sampling: dict[str, Any] = field(default_factory=dict)
    unsupported: dict[str, str] = field(default_factory=dict)  # capability -> why it is missing (said in the 400)


class Detokenizer(ABC):
    """Turns a growing list of token ids into text deltas without splitting multi-byte characters."""

    @abstractmethod
    def push(self, token_ids: list[int]) -> str:
        """Add tokens; return the text that became final."""

    @abstractmethod
    def flush(self) -> str:
        """End of stream: return whatever text remains."""


class Processor(ABC):
    """Converts protocol payloads into requests and outputs back, for one model.

    ``build_request`` gets a ``task`` ("completion", "chat", "speech",
    "image", "generate") and the already-parsed payload fields; it raises
    ``InvalidRequest`` (with ``param``) for anything the model cannot take.
    It returns a spec whose ``sampling.max_tokens`` is a number: a model with
    a context fits it there (``core.context.max_new_tokens``: None takes the
    room left, an explicit value that does not fit is an error).
    ``params_type`` is the model's request parameters struct: the API checks a
    request's parameters against it (``check_params``) before ``build_request``
    sees them, so an unknown or out-of-range one is a 400 naming it; the
    checked struct is what ``build_request`` gets and what the spec carries
    (a processor may resolve it into its family's own ``Params`` first). The
    base ``Params`` takes none.
    """

    params_type: type[Params] = Params
    kv_tokens: int | None = None  # what the runtime's smallest KV pool holds, once known (the API sets it)

    def served_context(self, context: int) -> tuple[int, str]:
        """The context a request fits (``core.context.max_new_tokens``), and what bounds it: the model's
        ``context``, or less when a KV pool of the runtime holds fewer tokens (``kv_tokens``): a request that
        outgrew the pool would fail halfway, so it is fitted to it, or refused, before it starts."""
        if self.kv_tokens is not None and self.kv_tokens < context:
            return self.kv_tokens, "the served context (what the KV pool holds)"
        return context, "the model's context"

    def fit_max_tokens(self, prompt_tokens: int, context: int, max_tokens: int | None, prompt_param: str) -> int:
        """``core.context.max_new_tokens`` in the served context (``served_context``) of the model's ``context``."""
        served, what = self.served_context(context)
        return max_new_tokens(prompt_tokens, served, max_tokens, prompt_param, what)

    def check_prompt_size(self, task: str, payload: dict[str, Any]) -> None:
        """Refuse a payload whose prompt, as given, cannot fit the served context however it tokenizes.

        Called by the API on its event loop before the request waits for ``build_request``: it must be cheap
        (lengths, not tokenization) and refuse only what ``build_request`` would refuse (InvalidRequest with
        code ``context_length_exceeded``). The base checks nothing.
        """
        return None

    def check_text_fits(self, text: str, context: int, prompt_param: str) -> None:
        """Refuse, before tokenizing it, a text too long to fit the served context of ``context`` whatever its
        tokens: n characters are at least ceil(n / L) tokens (L: ``Tokenizer.chars_per_token`` of the
        processor's ``tokenizer``; a processor without one refuses nothing here)."""
        tokenizer = getattr(self, "tokenizer", None)
        per_token = getattr(tokenizer, "chars_per_token", None)
        if per_token is None:
            return
        served, what = self.served_context(context)
        check_prompt_floor(tokenizer.min_tokens(text), served, prompt_param, what,
                           f" ({len(text)} characters, at most {per_token} per token)")

    def check_params(self, params: dict[str, Any]) -> Params:
        """The request's parameters as a ``params_type``, every field filled (InvalidRequest naming a bad one)."""
        return parse_params(self.params_type, params)

    @abstractmethod
    def card(self) -> ModelCard: ...

    @abstractmethod
    def build_request(
        self, task: str, payload: dict[str, Any], sampling: SamplingParams, params: Params
    ) -> RequestSpec:
        """The request for ``task``. For "completion" and "chat" the API builds the first of a prompt's n choices
        only and gives the others new ids and seeds (``api/openai/plan.build_choices``): such a request's inputs
        must not depend on ``sampling.seed`` (what does, like an image's noise seed, belongs to other tasks, or
        to ``node_sampling``, which makes the API build each choice)."""

    def policy_metadata(self) -> dict[str, Any]:
        """What a robot client is told first on the openpi websocket (models with the ``act`` capability)."""
        return {"model": self.card().id}

    def tokenize(self, text: str) -> list[int]:
        raise NotImplementedError(f"{type(self).__name__} has no tokenizer")

    def detokenizer(self, skip_special_tokens: bool = True) -> Detokenizer:
        raise NotImplementedError(f"{type(self).__name__} has no tokenizer")

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        d = self.detokenizer(skip_special_tokens)
        return d.push(token_ids) + d.flush()

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (for logprobs); a processor with a vocabulary knows them exactly."""
        return self.decode([token_id], skip_special_tokens=False).encode("utf-8")


class TokenizedProcessor(Processor):
    """A processor whose text goes through one tokenizer (``self.tokenizer``, set by the subclass): its
    encode, incremental detokenizer and exact token bytes. ``add_special_tokens`` is what ``tokenize``
    passes to ``encode`` (a Llama prompt starts with BOS; chat-templated models add none)."""

    tokenizer: Any
    add_special_tokens = False

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=self.add_special_tokens)

    def detokenizer(self, skip_special_tokens: bool = True) -> Detokenizer:
        return self.tokenizer.detokenizer(skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        return self.tokenizer.token_bytes(token_id)


class TensorProcessor(Processor):
    """The processor of a model without one of its own: ``/v1/generate`` with raw inputs.

    The payload's ``inputs`` (arrays, numbers, lists, strings) become the
    request's inputs as they are; the model's state machine reads them. This
    makes any walk graph servable over HTTP (a world model's frames and
    actions in, latents out).
    """

    def __init__(self, model_id: str, family: str, params_type: type[Params] = Params):
        self._card = ModelCard(id=model_id, family=family, capabilities=frozenset({"generate"}))
        self.params_type = params_type

    def card(self) -> ModelCard:
        return self._card

    def build_request(
        self, task: str, payload: dict[str, Any], sampling: SamplingParams, params: Params
    ) -> RequestSpec:
        from walkserve.core.array import ArrayData
        from walkserve.core.errors import InvalidRequest

        if task != "generate":
            raise InvalidRequest(f"this model only takes task 'generate', not {task!r}", param="task")
        inputs = payload.get("inputs")
        if not isinstance(inputs, dict) or not inputs:
            raise InvalidRequest("inputs must be a non-empty object", param="inputs")
        converted = {}
        for name, value in inputs.items():
            if isinstance(value, list):
                value = list_to_array(value, f"inputs.{name}")
            elif not isinstance(value, (ArrayData, int, float, str, bool)):
                raise InvalidRequest(f"input {name!r} must be an array, a number, a string or a list", param=f"inputs.{name}")
            converted[name] = value
        modalities = tuple(payload.get("modalities") or ("latent",))
        if sampling.max_tokens is None:  # no context to take the room of: SamplingParams' default bound
            sampling = dataclasses.replace(sampling, max_tokens=DEFAULT_MAX_TOKENS)
        return RequestSpec(converted, task=task, modalities=modalities, sampling=sampling, params=params)


def list_to_array(value: list, param: str):
    """A (nested, rectangular) list of numbers -> ArrayData: int64 when every number is an int, else float32."""
    from walkserve.core.array import ArrayData
    from walkserve.core.errors import InvalidRequest

    shape: list[int] = []
    probe: Any = value
    while isinstance(probe, list):
        shape.append(len(probe))
        probe = probe[0] if probe else None
    flat: list = []

    def walk(v: Any, depth: int) -> None:
        if depth == len(shape):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise InvalidRequest("array inputs must hold numbers only", param=param)
            flat.append(v)
            return
        if not isinstance(v, list) or len(v) != shape[depth]:
            raise InvalidRequest("nested lists must be rectangular", param=param)
        for item in v:
            walk(item, depth + 1)

    walk(value, 0)
    dtype = "int64" if all(isinstance(x, int) for x in flat) else "float32"
    if dtype == "int64" and any(not -(2**63) <= x < 2**63 for x in flat):
        raise InvalidRequest("integers must fit in 64 bits", param=param)
    array = ArrayData.from_list(flat, dtype)
    return ArrayData(dtype, tuple(shape), array.data)
