"""The whole Orpheus pipeline (KV engine LM -> streamed SNAC codec) against a plain offline loop.

The served side is walkserve's: processor, walk graph, ReferenceExecutor,
KVCacheEngine with the token-range mask, OrpheusCodec on the stateless path.
The offline side (walkserve/testing/orpheus_offline.py) is transformers
``generate`` with a LogitsProcessor for the same ranges plus the ``snac``
package decoding the same windows with the same seeds. Greedy sampling, so the
tokens must be identical and the audio equal up to float rounding.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch

import walkserve.models.builtin  # noqa: F401  (registers the families)
from walkserve.core.finish import FinishReason
from walkserve.engines.base import Engine, Group
from walkserve.engines.registry import build_engine
from walkserve.engines.spec import BuildContext
from walkserve.models.base import ModelRef
from walkserve.models.orpheus.emission import request_seed
from walkserve.models.orpheus.tokens import END_OF_SPEECH, allowed_ranges
from walkserve.models.registry import load_model
from walkserve.testing import orpheus_offline as offline
from walkserve.testing.reference import ReferenceExecutor

pytestmark = pytest.mark.parity
torch.set_num_threads(1)
CPU = BuildContext(rank=0, device="cpu", dtype="float32")


class Recording(Engine):
    """Passes groups through to an engine and records every token it samples, per request."""

    def __init__(self, inner: Engine):
        self.inner, self.component = inner, inner.component
        self.tokens: dict[str, list[int]] = defaultdict(list)

    def run_groups(self, groups: list[Group], may_yield: bool = False) -> list:
        results = self.inner.run_groups(groups, may_yield)
        for group, answers in zip(groups, results, strict=True):
            for rid, out in zip(group.request_ids, answers, strict=True):
                if isinstance(out, dict) and "token" in out:
                    self.tokens[rid].append(int(out["token"][0]))
        return results

    def release(self, request_id: str) -> None:
        self.inner.release(request_id)

    def state_count(self) -> int:
        return self.inner.state_count()


class Pipeline:
    def __init__(self, path):
        self.model = load_model(ModelRef("orpheus", str(path)))
        comps = self.model.components()
        self.lm = Recording(build_engine(comps["lm"], CPU, {"num_blocks": 32}))
        self.codec = build_engine(comps["codec"], CPU)
        self.executor = ReferenceExecutor(self.model.graph(), {"lm": self.lm, "codec": self.codec})
        self.processor = self.model.processor()
        self.hf = offline.load_lm(path / "lm")
        self.snac = offline.load_snac(path / "snac")

    def speak(self, text: str, voice: str = "tara", **sampling):
        spec = self.processor.build_request(
            "speech", {"input": text, "voice": voice}, self.processor.sampling(temperature=0.0, **sampling), self.processor.check_params({})
        )
        result = self.executor.run(spec)
        assert result.error is None, result.error
        self.lm.release(spec.id)
        audio = [a.reshape(-1) for a in result.stream("audio")]
        return spec, result, self.lm.tokens[spec.id], torch.cat(audio) if audio else torch.zeros(0)

    def reference(self, spec):
        s = spec.sampling
        return offline.offline_speech(
            self.hf, self.snac, spec.inputs["prompt_token_ids"].tolist(), s.max_tokens, s.stop_token_ids,
            request_seed(spec.id, s.seed), repetition_penalty=s.repetition_penalty,
        )


@pytest.fixture(scope="module")
def pipeline(tiny_orpheus_dir) -> Pipeline:
    return Pipeline(tiny_orpheus_dir)


def _check(spec, result, sampled, audio, want):
    produced = sampled[:-1] if want.stopped else sampled  # the stop token is sampled, never streamed
    assert produced == want.tokens
    for i, token in enumerate(produced):
        (lo, hi), _ = allowed_ranges(i)
        assert lo <= token < hi
    assert audio.shape == ((len(want.tokens) // 7) * 2048,)
    assert audio.abs().max() > 0.01
    torch.testing.assert_close(audio, want.audio, rtol=1e-4, atol=2e-5)
    assert result.finish == (FinishReason.STOP if want.stopped else FinishReason.LENGTH)


def test_greedy_speech_matches_the_offline_loop(pipeline):
    spec, result, sampled, audio = pipeline.speak("Hello there, how are you today?", max_tokens=47, seed=1234)
    want = pipeline.reference(spec)
    assert spec.sampling.repetition_penalty == 1.3 and len(want.tokens) >= 28  # several windows + the tail
    _check(spec, result, sampled, audio, want)
    assert result.walks == ["prefill", "decode"]


def test_a_stop_token_ends_the_stream_without_reaching_the_codec(pipeline):
    spec, *_ = pipeline.speak("The river ran quietly.", voice="leo", max_tokens=60, repetition_penalty=1.0)
    free = pipeline.reference(spec).tokens
    cut = next(i for i in range(33, 60) if free[i] not in free[:i])
    stop = free[cut]
    spec, result, sampled, audio = pipeline.speak(
        "The river ran quietly.", voice="leo", max_tokens=60, repetition_penalty=1.0, stop_token_ids=(stop,)
    )
    want = pipeline.reference(spec)
    assert want.stopped and want.tokens == free[:cut] and sampled[-1] == stop
    _check(spec, result, sampled, audio, want)


def test_short_stream_has_only_the_final_chunk(pipeline):
    spec, result, sampled, audio = pipeline.speak("Hi.", voice="zoe", max_tokens=20, seed=7)
    want = pipeline.reference(spec)
    assert len(want.tokens) < 28 and len(result.stream("audio")) == 1
    _check(spec, result, sampled, audio, want)


def test_requests_release_their_kv_state(pipeline):
    spec, *_ = pipeline.speak("Bye.", max_tokens=3)
    assert END_OF_SPEECH in spec.sampling.stop_token_ids
    assert pipeline.lm.state_count() == 0
