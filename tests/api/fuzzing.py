"""Schema-driven fuzzing shared by the fuzz tests: how many examples, how one generated request is sent and judged.

``WALKSERVE_FUZZ_EXAMPLES`` sets the examples per operation and generation
mode (default: a CI-sized handful); ``./dev fuzz`` raises it.
"""

from __future__ import annotations

import os
from collections import Counter

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.generation.modes import GenerationMode

from tests.api.helpers import assert_envelope

EXAMPLES = int(os.environ.get("WALKSERVE_FUZZ_EXAMPLES", "4"))
REQUEST_TIMEOUT_S = 30.0  # a generated request that takes longer counts as a hang
SHORT = {"max_tokens": 4, "max_completion_tokens": 4}  # generation lengths capped so a fuzz run stays short


def hypothesis_settings(examples: int = EXAMPLES) -> settings:
    return settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
                    database=None)


def operations(base_url: str) -> list:
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    return [result.ok() for result in schema.get_all_operations()]


def shorten(case) -> None:
    """Cap what makes a request long-running (token counts, images per call), keeping every other field as drawn."""
    if not isinstance(case.body, dict):
        return
    if case.path in ("/v1/completions", "/v1/chat/completions"):
        case.body.setdefault("max_tokens", SHORT["max_tokens"])  # a fake engine has no default length
    for key, cap in SHORT.items():
        value = case.body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > cap:
            case.body[key] = cap
    if case.path != "/v1/generate" and isinstance(case.body.get("n"), int) and case.body["n"] > 2:
        case.body["n"] = 2


def judge(case, statuses: Counter) -> None:
    """Send one generated request: it must answer in time, never 5xx, and every 4xx is the error envelope."""
    shorten(case)
    response = case.call(timeout=REQUEST_TIMEOUT_S)
    statuses[response.status_code // 100] += 1
    what = (case.method, case.path, case.body if not isinstance(case.body, bytes) else case.body[:200])
    assert response.status_code < 500, (*what, response.status_code, response.text[:500])
    if response.status_code >= 400:
        content_type = response.headers.get("content-type", [""])[0]
        assert content_type.startswith("application/json"), (*what, response.status_code, response.headers)
        assert_envelope(response, response.status_code)


def fuzz_operations(ops: list, mode: GenerationMode, examples: int = EXAMPLES) -> Counter:
    """Every operation fuzzed in ``mode``; the counts of answers by status class."""
    statuses: Counter = Counter()
    for operation in ops:
        if mode == GenerationMode.NEGATIVE and operation.method.upper() == "GET":
            continue  # the GET routes take no input a schema could forbid (a path string is any string)

        @given(case=operation.as_strategy(generation_mode=mode))
        @hypothesis_settings(examples)
        def run(case) -> None:
            judge(case, statuses)

        run()
    return statuses
