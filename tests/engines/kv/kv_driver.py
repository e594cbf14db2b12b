"""Drive a KVCacheEngine with firings the way a decode walk would, and the transformers greedy oracle."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from walkserve.core.sampling import SamplingParams
from walkserve.engines.base import Firing, FiringResult
from walkserve.engines.kv.engine import KVCacheEngine

GREEDY = SamplingParams(temperature=0.0, max_tokens=64)

_ids = itertools.count()


def firing(request_id: str, tokens, outputs=("token",), sampling=GREEDY, context="main", **inputs) -> Firing:
    return Firing(
        id=next(_ids),
        request_id=request_id,
        walk="decode",
        node="lm",
        component="lm",
        op="forward",
        path=(),
        inputs={"tokens": torch.as_tensor(tokens, dtype=torch.long), **inputs},
        outputs=tuple(outputs),
        sampling=sampling,
        node_params={"context": context},
    )


@dataclass
class Generation:
    """One request driven like a decode walk: prompt, then each sampled token fed back until ``max_new``."""

    request_id: str
    prompt: list[int]
    max_new: int
    sampling: SamplingParams = GREEDY
    join_step: int = 0
    tokens: list[int] = field(default_factory=list)

    def first(self) -> Firing:
        return firing(self.request_id, self.prompt, sampling=self.sampling)

    def on_result(self, result: FiringResult) -> Firing | None:
        assert result.error is None, result.error
        self.tokens.append(int(result.outputs["token"][0]))
        if len(self.tokens) == self.max_new:
            return None
        return firing(self.request_id, [self.tokens[-1]], sampling=self.sampling)


def drive(engine: KVCacheEngine, gens: list[Generation], max_steps: int = 2000) -> int:
    """Run requests to completion (each joins at its ``join_step``); release each when done. Returns steps."""
    by_id = {g.request_id: g for g in gens}
    pending = sorted(gens, key=lambda g: g.join_step)
    step = 0
    while pending or engine.has_work():
        while pending and pending[0].join_step <= step:
            engine.submit(pending.pop(0).first())
        for result in engine.step():
            follow = by_id[result.firing.request_id].on_result(result)
            if follow is None:
                engine.release(result.firing.request_id)
            else:
                engine.submit(follow)
        step += 1
        assert step < max_steps, "the engine stopped making progress"
    return step


def hf_greedy(hf_lm, prompt: list[int], max_new: int) -> list[int]:
    with torch.no_grad():
        out = hf_lm.generate(torch.tensor([prompt]), max_new_tokens=max_new, do_sample=False, pad_token_id=0)
    return out[0, len(prompt) :].tolist()
