"""How long a small request waits behind a big prompt, against a running ``walkserve serve`` of a text model.

For each big prompt (English text of N MB, as a completion and as a chat): the small completion's latency
alone (median of 5), then again sent 0.3 s after the big one, and the big one's own time and status; then
``/health`` behind a 2 MB completion. Usage::

    walkserve serve qwen3 --model-path DIR --port 8000 &
    python -m benchmarks prompt-stall --url http://127.0.0.1:8000 --mb 1 2 10
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

SMALL = "The river flows"
BEHIND_S = 0.3  # the big body is in and being built by then


def _body(route: str, text: str) -> tuple[str, dict]:
    if route == "chat":
        return "/v1/chat/completions", {"messages": [{"role": "user", "content": text}], "max_tokens": 1}
    return "/v1/completions", {"prompt": text, "max_tokens": 1}


def _timed(call) -> tuple[float, int]:
    start = time.perf_counter()
    status = call().status_code
    return time.perf_counter() - start, status


def behind(url: str, route: str, megabytes: float, probe=None) -> dict:
    """The small request (or ``probe``) sent while a big prompt of ``megabytes`` MB is in the server."""
    import httpx

    from walkserve.models.common.tiny_tokenizer import CORPUS

    n = int(megabytes * 1_000_000)
    big_path, big_body = _body(route, (CORPUS * (n // len(CORPUS) + 1))[:n])
    path, body = _body(route, SMALL)
    probe = probe or (lambda: httpx.post(url + path, json=body, timeout=300))
    alone = statistics.median(_timed(probe)[0] for _ in range(5))
    big: dict = {}
    thread = threading.Thread(target=lambda: big.update(zip(("s", "status"), _timed(
        lambda: httpx.post(url + big_path, json=big_body, timeout=300)))))
    thread.start()
    time.sleep(BEHIND_S)
    waited, status = _timed(probe)
    thread.join()
    return {"route": route, "big_mb": megabytes, "alone_s": round(alone, 3), "behind_big_s": round(waited, 3),
            "status": status, "big_s": round(big["s"], 3), "big_status": big["status"]}


def main(argv: list[str]) -> int:
    import httpx

    parser = argparse.ArgumentParser(prog="python -m benchmarks prompt-stall", description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--mb", type=float, nargs="+", default=[1, 2, 10])
    args = parser.parse_args(argv)
    for megabytes in args.mb:
        for route in ("completion", "chat"):
            print(json.dumps(behind(args.url, route, megabytes)), flush=True)
    health = behind(args.url, "completion", 2, lambda: httpx.get(args.url + "/health", timeout=300))
    print(json.dumps({**health, "route": "GET /health behind a completion"}), flush=True)
    return 0
