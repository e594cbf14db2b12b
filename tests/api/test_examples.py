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


# How an example shows it calls a route: the exact path (curl), or the client call that sends it
# (the openai package, walkserve.client). Nothing matches a route by a part of its name.
ROUTE_USES = {
    "/v1/completions": (r"(?<!\.chat)\.completions\.create\(", r"\bclient\.completions(_stream)?\("),
    "/v1/chat/completions": (r"\.chat\.completions\.create\(", r"\bclient\.chat(_stream)?\("),
    "/v1/audio/speech": (r"\.audio\.speech\.", r"\bclient\.speech(_stream|_to_file)?\("),
    "/v1/audio/transcriptions": (r"\.audio\.transcriptions\.create\(",),
    "/v1/audio/translations": (r"\.audio\.translations\.create\(",),
    "/v1/images/generations": (r"\.images\.generate\(", r"\bclient\.images\("),
    "/v1/images/edits": (r"\.images\.edit\(", r"\bclient\.image_edit\("),
    "/v1/generate": (r"\bclient\.generate\(",),
    "/health": (r"\bclient\.health\(",),
    "/metrics": (),
}


def routes_without_examples(scripts: list[Path]) -> list[str]:
    text = "".join(p.read_text() for p in scripts)
    missing = []
    for route, calls in ROUTE_USES.items():
        exact = re.escape(route) + r"(?![\w/-])"
        if not any(re.search(pattern, text) for pattern in (exact, *calls)):
            missing.append(route)
    return missing


def test_every_route_has_examples() -> None:
    assert routes_without_examples(PYTHON + CURL) == []


@pytest.mark.parametrize("route, stem", [("/v1/completions", "completions"), ("/v1/generate", "generate"),
                                         ("/v1/images/generations", "images"), ("/v1/chat/completions", "chat"),
                                         ("/v1/audio/translations", "transcriptions")])
def test_a_route_whose_examples_are_removed_is_missing(route: str, stem: str) -> None:
    """The check cannot be fooled by a neighbour: chat/completions is not completions, images/generations is not generate."""
    kept = [p for p in PYTHON + CURL if not p.stem.startswith(stem)]
    assert route in routes_without_examples(kept)
