"""Through the real runtime on a tiny Qwen3 with a 64K context: a prompt too long for it is refused at once,
by its length, and a long prompt that must be tokenized to know does not hold up a small request sent
meanwhile, nor the server's event loop (``/health``)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.api.real_server import in_thread_server
from walkserve.core.config import RuntimeConfig
from walkserve.models.common.tiny_tokenizer import CORPUS
from walkserve.models.llama.tiny import write_tiny
from walkserve.models.tokenizer import Tokenizer

pytestmark = pytest.mark.slow
CONTEXT = 65536
SMALL = {"prompt": "The river flows", "max_tokens": 1, "temperature": 0}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = write_tiny("qwen3", tmp_path_factory.mktemp("stall") / "tiny-qwen3", max_position_embeddings=CONTEXT)
    with in_thread_server("qwen3", path, RuntimeConfig(max_running=4)) as s:
        s.per_token = Tokenizer.from_dir(path).chars_per_token
        yield s


def text(chars: int) -> str:
    return (CORPUS * (chars // len(CORPUS) + 1))[:chars]


def test_a_prompt_too_long_for_the_context_is_refused_at_once(server):
    for route, body in (("/v1/completions", {"prompt": text(10_000_000)}),
                        ("/v1/chat/completions", {"messages": [{"role": "user", "content": text(10_000_000)}]})):
        start = time.monotonic()
        response = httpx.post(f"{server.url}{route}", json={**body, "max_tokens": 1}, timeout=120)
        assert time.monotonic() - start < 5, route  # tokenized, it took 9-13 s on a 2-core machine
        error = response.json()["error"]
        assert response.status_code == 400 and error["code"] == "context_length_exceeded", response.text
        assert error["message"].startswith("the prompt has at least ") and error["param"] in ("prompt", "messages")


def test_a_long_prompt_being_tokenized_holds_up_no_small_request(server):
    # as long as the floor lets in: it must be tokenized (~1 s) to learn it does not fit either
    long = {"prompt": text(server.per_token * (CONTEXT - 2)), "max_tokens": 1}
    done: dict[str, float] = {}

    def send(name, body):
        response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120)
        done[name] = time.monotonic()
        return response

    assert send("warm", SMALL).status_code == 200
    big = threading.Thread(target=lambda: done.setdefault("big_status", send("big", long).status_code))
    big.start()
    time.sleep(0.3)  # the body is in and being tokenized
    health = time.monotonic()
    assert httpx.get(f"{server.url}/health", timeout=60).status_code == 200
    done["health"] = time.monotonic()
    assert send("small", SMALL).status_code == 200
    big.join(120)
    assert done["big_status"] == 400
    assert done["small"] < done["big"], done  # before: the small one waited for the whole tokenization
    assert done["health"] - health < 0.5 * (done["big"] - health), done
