"""A DynamicLoop that stops at iteration k yields exactly k outputs, and nothing runs ahead of its stop rule.

The executor decides each iteration before the next one starts, so a decode
loop that finds its EOS at iteration k fired exactly k + 1 times (the EOS
iteration runs but is not exposed), with requests batched or each alone.
"""

from __future__ import annotations

import pytest

from tests.runtime.conftest import placement, start, wait_until
from walkserve.core.request import RequestSpec
from walkserve.core.sampling import SamplingParams
from walkserve.testing.fixtures.base import FixtureParams
from walkserve.testing.fixtures.requests import prompt


@pytest.mark.parametrize("cohorts", [True, False], ids=["batched", "alone"])
def test_stop_at_k_yields_k_outputs_and_runs_k_plus_one_steps(cohorts):
    requests = [
        RequestSpec({"prompt_ids": prompt(k, 4)}, sampling=SamplingParams(max_tokens=40, stop_token_ids=(0,)), params=FixtureParams(eos_at=k))
        for k in range(12)
    ]
    with start("fixture-lm", placement(1, {"lm": 0}), cohorts=cohorts) as engine:
        results = engine.run(requests)
        for k, r in enumerate(results):
            assert len(r.modality("text")) == k, (k, r.finished)
            assert 0 not in [int(e.data.item()) for e in r.events]  # the EOS iteration is never exposed

        def counters():
            engine.stats()
            worker = engine.status.stats.workers.get(0)
            return worker.counters if worker else {}

        want = len(requests) + sum(k + 1 for k in range(12))  # one prefill each, then k + 1 decode steps
        assert wait_until(lambda: counters().get("firings", 0) >= want)
        assert counters()["firings"] == want
