"""The playground in headless Chromium against ``walkserve serve`` with no model (the embedded tiny Orpheus).

One server per module, started as the CLI is (``--default-max-tokens 71``: 10
frames of 2048 samples at 24 kHz, so every spoken answer is 0.853 s long: seeded, since the random LM
unseeded samples END_OF_SPEECH early in about one answer in seventy).
"""

from __future__ import annotations

import time

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from tests.api.browser import chromium, console_errors, wait_until
from tests.api.real_server import OutputReader, free_port, start_cli, wait_healthy

pytestmark = pytest.mark.slow
MAX_TOKENS = 71
AUDIO_SECONDS = (MAX_TOKENS // 7) * 2048 / 24000
SEED = 11  # the speech form's seed: these 71 tokens hold no END_OF_SPEECH


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    port = free_port()
    process = start_cli(["--port", str(port), "--default-max-tokens", str(MAX_TOKENS), "--api-key", "pg-key"],
                        env={"WALKSERVE_CACHE_DIR": str(tmp_path_factory.mktemp("walkserve-cache"))})
    output = OutputReader(process)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process, output, timeout=240)
        yield url
    finally:
        process.terminate()
        process.wait(60)
        output.join()


@pytest.fixture(scope="module")
def browser():
    with chromium() as driver:
        yield driver


def audio_duration(driver) -> float:
    return driver.execute_script(
        "const a = document.getElementById('speech-audio');"
        "return a.readyState >= 1 && isFinite(a.duration) ? a.duration : 0;")


def open_with_key(driver, url: str) -> None:
    """Type the key into the page, reload: the key is kept in the tab's session and sent as a bearer."""
    driver.get(url)
    key = driver.find_element(By.ID, "api-key")
    key.clear()
    key.send_keys("pg-key")
    driver.execute_script("document.getElementById('api-key').dispatchEvent(new Event('change'))")
    assert all("401" in e for e in console_errors(driver))  # the load before the key was typed
    driver.refresh()
    wait_until(driver, lambda d: d.find_element(By.ID, "model-name").text.startswith("orpheus-tiny-random"), 30, "the model card")
    assert driver.find_element(By.ID, "api-key").get_attribute("value") == "pg-key"


def test_without_the_key_the_page_says_why(served, browser):
    browser.get(served)
    banner = None
    for _ in range(300):
        banner = browser.execute_script("const e = document.getElementById('error'); return e.hidden ? null : e.textContent")
        if banner:
            break
        time.sleep(0.1)
    assert "401" in banner and "API key" in banner
    assert not browser.find_element(By.ID, "speech").is_displayed()
    errors = console_errors(browser)
    assert all("/v1/models" in e and "401" in e for e in errors), errors  # the failed fetch itself, nothing else


def test_speak_streams_playable_audio(served, browser):
    open_with_key(browser, served)
    assert browser.find_element(By.ID, "speech").is_displayed()
    assert not browser.find_element(By.ID, "chat").is_displayed()  # Orpheus has no chat capability
    voices = [o.get_attribute("value") for o in Select(browser.find_element(By.ID, "speech-voice")).options]
    assert voices and all(voices), voices  # the card's voices, none blank
    browser.find_element(By.ID, "speech-input").clear()
    browser.find_element(By.ID, "speech-input").send_keys("The playground speaks one sentence.")
    browser.find_element(By.ID, "speech-seed").send_keys(str(SEED))
    browser.find_element(By.ID, "speech-send").click()
    duration = wait_until(browser, audio_duration, 180, "the spoken answer")
    assert duration == pytest.approx(AUDIO_SECONDS, abs=0.01)
    stats = browser.find_element(By.ID, "speech-stats").text
    assert "first audio" in stats and f"{AUDIO_SECONDS:.2f} s of audio" in stats and "audio s/s" in stats
    assert console_errors(browser) == []


def test_speak_whole_file_in_the_chosen_format(served, browser):
    if browser.find_element(By.ID, "speech-live").is_selected():
        browser.find_element(By.ID, "speech-live").click()
    Select(browser.find_element(By.ID, "speech-format")).select_by_value("wav")
    browser.execute_script("document.getElementById('speech-audio').removeAttribute('src');"
                           "document.getElementById('speech-audio').load()")
    browser.find_element(By.ID, "speech-send").click()
    duration = wait_until(browser, audio_duration, 180, "the spoken answer")
    assert duration == pytest.approx(AUDIO_SECONDS, abs=0.01)
    assert console_errors(browser) == []


def test_the_timeline_link_saves_the_requests_timeline(served, browser):
    """After an answer, its figures end with a "timeline" link: it fetches GET /v1/requests/{id}/timeline with the
    key and saves the file (the save is caught here, and the blob it would write read back)."""
    link = wait_until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#speech-stats a.timeline"), 30, "the link")
    browser.execute_script(
        "window.__saved = null; const click = HTMLAnchorElement.prototype.click, make = URL.createObjectURL;"
        "URL.createObjectURL = (blob) => { window.__blob = blob; return make(blob); };"
        "HTMLAnchorElement.prototype.click = function () { if (this.download) window.__saved = this.download;"
        " else click.call(this); };")
    link[0].click()
    name = wait_until(browser, lambda d: d.execute_script("return window.__saved"), 30, "the saved timeline")
    assert name.startswith("timeline-http-") and name.endswith(".json")
    names = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "window.__blob.text().then((text) => done(JSON.parse(text).traceEvents.filter((e) => e.ph === 'X')"
        ".map((e) => e.name))).catch((e) => done(String(e)));")
    assert {"lm", "codec", "POST /v1/audio/speech"} <= set(names), names
    assert console_errors(browser) == []
