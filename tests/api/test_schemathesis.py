"""Property-based fuzzing of every route from /openapi.json on the fake engine: no 5xx, every error in the one
envelope (``tests/api/fuzzing.py`` judges each request; ``test_fuzz_families.py`` does the same on every family).

Schemathesis generates schema-conforming (positive) and schema-violating
(negative) requests per operation; a bounded number of each keeps the file
well under a minute (``WALKSERVE_FUZZ_EXAMPLES`` raises it).
"""

from __future__ import annotations

import pytest
from schemathesis.generation.modes import GenerationMode

from tests.api import fuzzing

EXAMPLES = max(20, fuzzing.EXAMPLES)


@pytest.fixture(scope="module")
def operations(base_url: str) -> list:
    return fuzzing.operations(base_url)


def test_schema_lists_every_route(operations: list) -> None:
    paths = {(op.method.upper(), op.path) for op in operations}
    for route in ("/v1/completions", "/v1/chat/completions", "/v1/audio/speech", "/v1/audio/transcriptions",
                  "/v1/audio/translations", "/v1/images/generations",
                  "/v1/images/edits", "/v1/generate"):
        assert ("POST", route) in paths
    assert ("GET", "/health") in paths and ("GET", "/v1/models") in paths and ("GET", "/metrics") in paths
    assert all(op.body for op in operations if op.method.upper() == "POST"), "every POST route documents its body"


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
def test_fuzz_every_operation(operations: list, mode: GenerationMode) -> None:
    statuses = fuzzing.fuzz_operations(operations, mode, EXAMPLES)
    assert statuses[4] > 20, statuses  # the fuzzer did reach the validators
    if mode == GenerationMode.POSITIVE:
        assert statuses[2] > 20, statuses
