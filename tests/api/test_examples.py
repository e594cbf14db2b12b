"""Every example script runs against a live server (curl scripts only where curl is installed)."""

from __future__ import annotations

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


def test_every_route_has_examples() -> None:
    text = "".join(p.read_text() for p in PYTHON + CURL)
    for route in ("/v1/completions", "/v1/chat/completions", "/v1/audio/speech", "/v1/images/generations", "/v1/images/edits", "/v1/generate", "/health", "/metrics"):
        assert route in text or route.split("/")[-1] in text, route
