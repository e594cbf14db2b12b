"""A DynamicLoop that stops at iteration k yields exactly k outputs, speculation on or off; at most one wasted step.

With loop cohorts (the default) the stop rule runs between steps, so nothing
is speculative and nothing is wasted; without, each iteration is a firing and
speculation may run one step ahead.
"""

from __future__ import annotations

import pytest

from tests.runtime.conftest import placement, start, wait_until
from walkserve.core.request import RequestSpec
from walkserve.core.sampling import SamplingParams
from walkserve.testing.fixtures.requests import prompt


@pytest.mark.parametrize("cohorts", [True, False], ids=["cohorts", "firings"])
@pytest.mark.parametrize("speculation", [True, False])
def test_stop_at_k_yields_k_outputs(speculation, cohorts):
    requests = [
        RequestSpec({"prompt_ids": prompt(k, 4)}, sampling=SamplingParams(max_tokens=40, stop_token_ids=(0,)), params={"eos_at": k})
        for k in range(12)
    ]
    with start("fixture-lm", placement(1, {"lm": 0}), speculation=speculation, cohorts=cohorts) as engine:
        results = engine.run(requests)
        for k, r in enumerate(results):
            assert len(r.modality("text")) == k, (k, r.finished)
            assert 0 not in [int(e.data.item()) for e in r.events]  # the EOS iteration is never exposed
        def counters():
            workers = engine.stats() and engine.status.stats["workers"]
            return workers.get(0) or workers.get("0") or {}

        c = wait_until(lambda: counters().get("counters", {}).get("firings", 0) >= sum(range(12)) and counters()["counters"])
        assert c["firings"] >= sum(range(12))
        if cohorts:
            # every decode step ran in the cohort: k + 1 iterations (the last one finds EOS)
            assert c.get("cohort_firings", 0) == sum(k + 1 for k in range(12))
            assert c.get("speculative", 0) == 0 and c.get("wasted", 0) == 0
        elif speculation:
            assert c.get("cohort_firings", 0) == 0
            assert c.get("speculative", 0) > 0
            assert c.get("wasted", 0) <= len(requests)
        else:
            assert c.get("speculative", 0) == 0 and c.get("wasted", 0) == 0
