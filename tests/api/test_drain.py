"""SIGTERM on `python -m walkserve.api`: health turns 503, the in-flight stream completes, exit code 0."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(port: int) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "walkserve.api",
        "--engine", "walkserve.testing.fake_engine:build_fake_engine",
        "--engine-option", "token_delay_s=0.01",
        "--port", str(port), "--drain-timeout", "20", "--log-level", "info",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)


def wait_healthy(base: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stdout.read()
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise AssertionError("server did not become healthy")


def test_sigterm_drains_then_exits_zero() -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process = start_server(port)
    try:
        wait_healthy(base, process)
        lines: list[str] = []
        first = threading.Event()

        def consume() -> None:
            body = {"prompt": "drain me", "max_tokens": 120, "ignore_eos": True, "stream": True}
            with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=30) as response:
                for line in response.iter_lines():
                    lines.append(line)
                    first.set()

        reader = threading.Thread(target=consume)
        reader.start()
        assert first.wait(10)
        process.send_signal(signal.SIGTERM)
        time.sleep(0.1)
        health = httpx.get(f"{base}/health", timeout=2)
        assert health.status_code == 503 and health.json()["status"] == "draining"
        assert health.json()["error"]["code"] == "health_draining"
        refused = httpx.post(f"{base}/v1/completions", json={"prompt": "late"}, timeout=2)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
        assert process.poll() is None  # still draining while the stream runs
        reader.join(30)
        chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        assert lines[-2:] == ["data: [DONE]", ""] or lines[-1] == "data: [DONE]"
        assert sum(len(c["choices"][0]["text"].encode()) for c in chunks) == 120
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert process.wait(20) == 0
        output = process.stdout.read()
        assert "engine shut down" in output
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()
