"""The playground's chat in headless Chromium against a tiny random-weight Llama on the real runtime.

The streamed answer the page shows must be the engine's own greedy text for the
same messages (sent straight to the engine), so a chunk lost or doubled by the
page's SSE parsing fails the test.
"""

from __future__ import annotations

import pytest
from selenium.webdriver.common.by import By

from tests.api.browser import chromium, console_errors, wait_until
from tests.api.real_server import in_thread_server
from walkserve.api.openai.choices import token_ids
from walkserve.core.config import RuntimeConfig
from walkserve.core.sampling import SamplingParams
from walkserve.models.llama.tiny import write_tiny

pytestmark = pytest.mark.slow
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = write_tiny("llama", tmp_path_factory.mktemp("pg-llama") / "tiny-llama", seed=3)
    with in_thread_server("llama", path, RuntimeConfig(max_running=4)) as s:
        yield s


@pytest.fixture(scope="module")
def browser():
    with chromium() as driver:
        yield driver


def engine_text(server, messages: list[dict]) -> str:
    processor = server.engine.processor
    spec = processor.build_request("chat", {"messages": messages},
                                   SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True), processor.check_params({}))
    events, _ = server.run_direct(spec)
    return processor.decode([t for e in events if e.modality == "text" for t in token_ids(e.data)])


def test_chat_streams_the_engines_answer(server, browser):
    browser.get(server.url)
    wait_until(browser, lambda d: d.find_element(By.ID, "model-name").text.startswith("tiny-llama"), 30, "the model card")
    assert browser.find_element(By.ID, "chat").is_displayed()
    assert not browser.find_element(By.ID, "speech").is_displayed()
    assert not browser.find_element(By.ID, "chat-speak-label").is_displayed()  # no audio_out
    browser.find_element(By.ID, "chat-temperature").send_keys("0")
    browser.find_element(By.ID, "chat-max-tokens").clear()
    browser.find_element(By.ID, "chat-max-tokens").send_keys(str(MAX_TOKENS))
    browser.find_element(By.ID, "chat-input").send_keys("Tell me about rivers.")
    browser.find_element(By.ID, "chat-send").click()
    stats = wait_until(browser, lambda d: d.find_element(By.ID, "chat-stats").text, 120, "the chat answer")
    answer = browser.execute_script("return document.querySelector('#chat-log .assistant').textContent")
    assert "first token" in stats and "tokens/s" in stats
    tokens = int(stats.split(" tokens ·")[0].rsplit("· ", 1)[1])
    assert 1 <= tokens <= MAX_TOKENS
    want = engine_text(server, [{"role": "user", "content": "Tell me about rivers."}])  # may run on past an EOS
    assert answer and want.startswith(answer), (answer, want)
    assert console_errors(browser) == []


def test_api_errors_show_their_message(server, browser):
    browser.find_element(By.ID, "chat-max-tokens").clear()
    browser.find_element(By.ID, "chat-max-tokens").send_keys("100000")  # beyond the tiny model's context
    browser.find_element(By.ID, "chat-input").send_keys("Again.")
    browser.find_element(By.ID, "chat-send").click()
    banner = wait_until(browser, lambda d: d.execute_script(
        "const e = document.getElementById('error'); return e.hidden ? null : e.textContent"), 60, "the error",
        banner_fails=False)
    assert banner.startswith("400: ") and "context" in banner.lower(), banner
    assert browser.find_element(By.ID, "chat-send").is_enabled()
