"""Property-based fuzzing of every route from /openapi.json: no 5xx, every error in the one envelope.

Schemathesis generates schema-conforming (positive) and schema-violating
(negative) requests per operation; a bounded number of each keeps the file
well under a minute.
"""

from __future__ import annotations

from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.generation.modes import GenerationMode

EXAMPLES = {GenerationMode.POSITIVE: 20, GenerationMode.NEGATIVE: 20}


@pytest.fixture(scope="module")
def operations(base_url: str) -> list:
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    return [result.ok() for result in schema.get_all_operations()]


def check(case, statuses: Counter) -> None:
    if case.path == "/v1/chat/completions" and isinstance(case.body, dict):
        case.body.setdefault("max_tokens", 4)  # keep generated chats short-running
    response = case.call(timeout=20)
    statuses[response.status_code // 100] += 1
    assert response.status_code < 500, (case.method, case.path, case.body, response.status_code, response.text[:500])
    if response.status_code >= 400:
        body = response.json()
        assert set(body["error"]) == {"message", "type", "param", "code"}, body
        assert "Traceback" not in body["error"]["message"]


def test_schema_lists_every_route(operations: list) -> None:
    paths = {(op.method.upper(), op.path) for op in operations}
    for route in ("/v1/completions", "/v1/chat/completions", "/v1/audio/speech", "/v1/audio/transcriptions",
                  "/v1/audio/translations", "/v1/images/generations",
                  "/v1/images/edits", "/v1/generate"):
        assert ("POST", route) in paths
    assert ("GET", "/health") in paths and ("GET", "/v1/models") in paths and ("GET", "/metrics") in paths
    assert all(op.body for op in operations if op.method.upper() == "POST"), "every POST route documents its body"


@pytest.mark.parametrize("mode", list(EXAMPLES), ids=str)
def test_fuzz_every_operation(operations: list, mode: GenerationMode) -> None:
    statuses: Counter = Counter()
    for operation in operations:
        if mode == GenerationMode.NEGATIVE and operation.method.upper() == "GET":
            continue  # the GET routes take no input a schema could forbid (a path string is any string)

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES[mode], deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None)
        def run(case) -> None:
            check(case, statuses)

        run()
    assert statuses[4] > 20, statuses  # the fuzzer did reach the validators
    if mode == GenerationMode.POSITIVE:
        assert statuses[2] > 20, statuses
