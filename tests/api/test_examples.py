"""Every example script runs against a live server (curl scripts only where curl is installed)."""

from __future__ import annotations

import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PYTHON = sorted(p for p in (EXAMPLES / "openai_client").glob("*.py") if not p.name.startswith("_")) + sorted((EXAMPLES / "sdk").glob("*.py"))
CURL = sorted((EXAMPLES / "curl").glob("*.sh"))
CURL = [p for p in CURL if not p.name.startswith("_")]


@pytest.mark.parametrize("script", PYTHON, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_python_example(script: Path, base_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(script.parent))
    monkeypatch.setattr(sys, "argv", [str(script), base_url, str(tmp_path / "out.wav") if "speech_stream" in script.name or "chat_audio" in script.name else str(tmp_path)])
    runpy.run_path(str(script), run_name="__main__")
    assert capsys.readouterr().out.strip()


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
@pytest.mark.parametrize("script", CURL, ids=lambda p: p.name)
def test_curl_example(script: Path, base_url: str, tmp_path: Path) -> None:
    result = subprocess.run(["bash", str(script), base_url, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr + result.stdout
    assert result.stdout.strip() and '"error"' not in result.stdout, result.stdout[:1000]


# How an example shows it calls a route: the exact path after the base URL (curl: "$BASE/v1/..."), or the client call that sends it
# (the openai package, walkserve.client). Nothing matches a route by a part of its name. The routes
# themselves come from the app (``served_routes``); a route listed nowhere here needs its exact path.
ROUTE_USES = {
    "/v1/completions": (r"(?<!\.chat)\.completions\.create\(", r"\bclient\.completions(_stream)?\("),
    "/v1/chat/completions": (r"\.chat\.completions\.create\(", r"\bclient\.chat(_stream)?\("),
    "/v1/audio/speech": (r"\.audio\.speech\.", r"\bclient\.speech(_stream|_to_file)?\("),
    "/v1/audio/transcriptions": (r"\.audio\.transcriptions\.create\(",),
    "/v1/audio/translations": (r"\.audio\.translations\.create\(",),
    "/v1/realtime": (r"\.realtime\.connect\(",),
    "/v1/images/generations": (r"\.images\.generate\(", r"\bclient\.images\("),
    "/v1/images/edits": (r"\.images\.edit\(", r"\bclient\.image_edit\("),
    "/v1/generate": (r"\bclient\.generate\(",),
    "/v1/models": (r"\.models\.list\(",),
    "/v1/models/{model}": (r"\.models\.retrieve\(",),
    "/health": (r"\bclient\.health\(",),
    "/v1/requests/{request_id}/timeline": (r"\bBASE\}?/v1/requests/\$\w+/timeline\b",),
}
# Routes the examples' server (the fake engine: text, audio, images) cannot serve, each with the test that
# calls it on a model that can, and what in that test shows it.
SHOWN_ELSEWHERE = {
    "/v1/embeddings": ("tests/models/vjepa2/test_serving.py", "/v1/embeddings"),
    "/v1/openpi": ("tests/runtime/test_pi05_runtime.py", '"/v1/openpi"'),
    "/": ("tests/runtime/test_pi05_runtime.py", 'path "/"'),
}
ROOT = EXAMPLES.parent


def served_routes() -> set[str]:
    """Every path the server's app answers (HTTP and websocket), read from its router."""
    from walkserve.api.app import build_app
    from walkserve.testing.fake_engine import FakeEngine, FakeEngineConfig

    app = build_app(FakeEngine(FakeEngineConfig()))
    documented = set(app.openapi()["paths"])
    return documented | {path for path, kind in _walk(app.routes) if kind == "websocket"}


def _walk(routes, prefix: str = ""):
    for route in routes:
        if hasattr(route, "path"):
            yield prefix + route.path, "websocket" if type(route).__name__.endswith("WebSocketRoute") else "http"
        else:  # an included router (FastAPI keeps the original inside it)
            inner = getattr(route, "original_router", None)
            context = getattr(route, "include_context", None)
            yield from _walk(inner.routes if inner is not None else [], prefix + getattr(context, "prefix", ""))


def routes_without_examples(scripts: list[Path], routes: set[str] | None = None) -> list[str]:
    text = "".join(p.read_text() for p in scripts)
    missing = []
    for route in sorted(served_routes() if routes is None else routes):
        exact = r"\bBASE\}?" + re.escape(route).replace(r"\{model\}", r"[^/\s\"']+") + r"(?![\w/-])"
        if not any(re.search(pattern, text) for pattern in (exact, *ROUTE_USES.get(route, ()))):
            missing.append(route)
    return missing


def test_the_route_list_comes_from_the_app() -> None:
    routes = served_routes()
    assert {"/v1/chat/completions", "/v1/embeddings", "/v1/models/{model}", "/v1/openpi", "/"} <= routes
    assert not any(path.startswith("/docs") or path == "/openapi.json" for path in routes)


def test_every_route_has_examples() -> None:
    assert routes_without_examples(PYTHON + CURL) == sorted(SHOWN_ELSEWHERE)


def test_routes_without_examples_are_shown_by_a_test() -> None:
    for route, (where, evidence) in SHOWN_ELSEWHERE.items():
        assert evidence in (ROOT / where).read_text(), (route, where)


def test_a_new_route_without_an_example_is_missing() -> None:
    assert routes_without_examples(PYTHON + CURL, served_routes() | {"/v1/rerank"}) == sorted({*SHOWN_ELSEWHERE, "/v1/rerank"})


@pytest.mark.parametrize("route, stem", [("/v1/completions", "completions"), ("/v1/generate", "generate"),
                                         ("/v1/images/generations", "images"), ("/v1/chat/completions", "chat"),
                                         ("/v1/audio/translations", "transcriptions"), ("/v1/realtime", "realtime"),
                                         ("/v1/models/{model}", "speech")])
def test_a_route_whose_examples_are_removed_is_missing(route: str, stem: str) -> None:
    """The check cannot be fooled by a neighbour: chat/completions is not completions, images/generations is not generate."""
    kept = [p for p in PYTHON + CURL if not p.stem.startswith(stem)]
    assert route in routes_without_examples(kept)
