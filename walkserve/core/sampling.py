"""Per-request sampling parameters, validated at construction."""

from __future__ import annotations

import math
from dataclasses import dataclass

from walkserve.core.errors import InvalidRequest

MAX_SEED = 2**63 - 1
MAX_LOGIT_BIAS = 300  # entries, as OpenAI allows


def _finite(name: str, value: float, lo: float | None = None, hi: float | None = None) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise InvalidRequest(f"{name} must be a finite number, got {value!r}", param=name)
    if lo is not None and value < lo:
        raise InvalidRequest(f"{name} must be >= {lo}, got {value}", param=name)
    if hi is not None and value > hi:
        raise InvalidRequest(f"{name} must be <= {hi}, got {value}", param=name)


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are drawn from logits.

    temperature 0 means greedy. ``seed`` makes the draws of one request
    reproducible whatever else shares its batch. ``max_tokens`` counts generated
    tokens; None asks for as many as the context has room for (a model's
    processor resolves it, ``core/context.py``); ``stop_token_ids`` end generation (the stop token itself is not
    returned); ``stop`` strings are matched by the frontend on decoded text.
    """

    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    max_tokens: int | None = 16
    min_tokens: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None  # the prompt's own log-probabilities (and this many top ones per token)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit), OpenAI's -100..100

    def __post_init__(self) -> None:
        _finite("temperature", self.temperature, 0.0, 100.0)
        _finite("top_p", self.top_p, 0.0, 1.0)
        if self.top_p == 0.0:
            raise InvalidRequest("top_p must be > 0", param="top_p")
        _finite("min_p", self.min_p, 0.0, 1.0)
        _finite("repetition_penalty", self.repetition_penalty, 0.01, 100.0)
        _finite("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _finite("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        for name in ("top_k", "max_tokens", "min_tokens"):
            value = getattr(self, name)
            if name == "max_tokens" and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidRequest(f"{name} must be a non-negative integer", param=name)
        if self.max_tokens is not None and self.max_tokens < 1:
            raise InvalidRequest("max_tokens must be >= 1", param="max_tokens")
        if self.top_k > 1 << 30:
            raise InvalidRequest("top_k is too large", param="top_k")
        if self.seed is not None and (
            not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed <= MAX_SEED
        ):
            raise InvalidRequest(f"seed must be an integer in [0, {MAX_SEED}]", param="seed")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise InvalidRequest("logprobs must be in [0, 20]", param="logprobs")
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= 20:
            raise InvalidRequest("prompt_logprobs must be in [0, 20]", param="prompt_logprobs")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise InvalidRequest("stop_token_ids must be non-negative integers", param="stop_token_ids")
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise InvalidRequest(f"logit_bias has {len(self.logit_bias)} entries; at most {MAX_LOGIT_BIAS}", param="logit_bias")
        for token, bias in self.logit_bias:
            if not isinstance(token, int) or isinstance(token, bool) or token < 0:
                raise InvalidRequest("logit_bias keys must be non-negative token ids", param="logit_bias")
            _finite("logit_bias", bias, -100.0, 100.0)
        if len({t for t, _ in self.logit_bias}) != len(self.logit_bias):
            raise InvalidRequest("logit_bias names a token twice", param="logit_bias")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
