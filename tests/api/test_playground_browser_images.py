"""The playground's image generation and edit in headless Chromium against tiny BAGEL on the real runtime (CPU)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from PIL import Image
from selenium.webdriver.common.by import By

from tests.api.browser import chromium, console_errors, wait_until
from tests.api.real_server import in_thread_server
from walkserve.cli.placement_arg import placement_path
from walkserve.models.bagel.tiny import write_tiny_bagel

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = write_tiny_bagel(tmp_path_factory.mktemp("pg-bagel") / "tiny", seed=1)
    placement = yaml.safe_load(placement_path("bagel").read_text())
    for rank in placement["ranks"]:
        rank["device"] = "cpu"
    with in_thread_server("bagel", path, placement=placement) as s:
        yield s


@pytest.fixture(scope="module")
def browser():
    with chromium() as driver:
        yield driver


def shown_sizes(driver) -> list[list[int]] | None:
    """(width, height) of every decoded image in the output, once all have loaded."""
    return driver.execute_script(
        "const imgs = [...document.querySelectorAll('#image-out img')];"
        "if (!imgs.length || !imgs.every(i => i.complete && i.naturalWidth)) return null;"
        "return imgs.map(i => [i.naturalWidth, i.naturalHeight]);")


def test_generate_shows_the_image(server, browser):
    browser.get(server.url)
    wait_until(browser, lambda d: d.find_element(By.ID, "model-name").text.startswith("tiny"), 30, "the model card")
    assert browser.find_element(By.ID, "images").is_displayed() and browser.find_element(By.ID, "chat").is_displayed()
    assert browser.find_element(By.ID, "image-edit-label").is_displayed()
    size = browser.find_element(By.ID, "image-size")
    size.clear()
    size.send_keys("64x32")
    browser.find_element(By.ID, "image-steps").send_keys("3")
    browser.find_element(By.ID, "image-seed").send_keys("4")
    browser.find_element(By.ID, "image-send").click()
    assert wait_until(browser, shown_sizes, 180, "the generated image") == [[64, 32]]
    assert "1 image(s)" in browser.find_element(By.ID, "image-stats").text
    assert console_errors(browser) == []


def test_edit_sends_the_chosen_file(server, browser, tmp_path):
    source = tmp_path / "source.png"
    Image.fromarray(np.random.default_rng(2).integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(source)
    browser.execute_script("document.getElementById('image-out').replaceChildren()")
    browser.find_element(By.ID, "image-source").send_keys(str(source))
    size = browser.find_element(By.ID, "image-size")
    size.clear()
    size.send_keys("auto")
    browser.find_element(By.ID, "image-send").click()
    sizes = wait_until(browser, shown_sizes, 300, "the edited image")
    assert len(sizes) == 1 and min(sizes[0]) > 0
    assert console_errors(browser) == []


def test_chat_with_an_attached_image(server, browser, tmp_path):
    """An attached file goes as an ``image_url`` part (BAGEL has ``image_in``); the streamed answer shows."""
    picture = tmp_path / "look.png"
    Image.fromarray(np.random.default_rng(3).integers(0, 256, (24, 24, 3), dtype=np.uint8)).save(picture)
    browser.find_element(By.ID, "chat-files").send_keys(str(picture))
    browser.find_element(By.ID, "chat-max-tokens").clear()
    browser.find_element(By.ID, "chat-max-tokens").send_keys("4")
    browser.find_element(By.ID, "chat-input").send_keys("What is in the picture?")
    browser.execute_script("""window.sentBodies = []; const real = window.fetch;
        window.fetch = (url, init) => { window.sentBodies.push(init && init.body); return real(url, init); };""")
    browser.find_element(By.ID, "chat-send").click()
    stats = wait_until(browser, lambda d: d.find_element(By.ID, "chat-stats").text, 180, "the chat answer")
    assert "first token" in stats and "tokens/s" in stats
    tokens = int(stats.split(" tokens ·")[0].rsplit("· ", 1)[1])
    assert 1 <= tokens <= 4
    answer = browser.execute_script("return document.querySelector('#chat-log .assistant').textContent")
    assert answer  # random weights: some text, whatever it says
    [body] = [json.loads(b) for b in browser.execute_script("return window.sentBodies") if b]
    text, image = body["messages"][-1]["content"]
    assert text == {"type": "text", "text": "What is in the picture?"}
    assert image["type"] == "image_url" and image["image_url"]["url"].startswith("data:image/png;base64,")
    assert console_errors(browser) == []
