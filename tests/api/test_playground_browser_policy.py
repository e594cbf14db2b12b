"""The playground's policy form in headless Chromium against a tiny pi0 on the real runtime: the page's
example observation runs as is and the action chunk comes back as a table (horizon rows x action dims)."""

from __future__ import annotations

import json

import pytest
from selenium.webdriver.common.by import By

from tests.api.browser import chromium, console_errors, wait_until
from tests.api.real_server import in_thread_server
from walkserve.core.config import RuntimeConfig
from walkserve.models.pi0.tiny import write_tiny_policy

pytestmark = pytest.mark.slow
HORIZON, ACTION_DIM = 10, 7  # the tiny pi0's action chunk


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = write_tiny_policy("pi0", tmp_path_factory.mktemp("pg-pi0") / "tiny-pi0", seed=5)
    with in_thread_server("pi0", path, RuntimeConfig(worker_threads=1)) as s:
        yield s


def test_policy_form_posts_the_example_observation(server):
    with chromium() as browser:
        browser.get(server.url)
        wait_until(browser, lambda d: d.find_element(By.ID, "robot").is_displayed(), 30, "the policy form")
        assert [o.text for o in browser.find_elements(By.CSS_SELECTOR, "#robot-task option")] == ["act"]
        example = json.loads(browser.find_element(By.ID, "robot-inputs").get_attribute("value"))
        assert example["base_0_rgb"]["url"].startswith("data:image/png;base64,") and example["prompt"]
        browser.find_element(By.ID, "robot-send").click()
        table = wait_until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#robot-out table"), 120, "the actions")
        rows = table[0].find_elements(By.TAG_NAME, "tr")
        assert len(rows) == HORIZON and all(len(r.find_elements(By.TAG_NAME, "td")) == ACTION_DIM for r in rows)
        values = [float(td.text) for td in rows[0].find_elements(By.TAG_NAME, "td")]
        assert all(abs(v) < 1e6 for v in values)
        assert "s" in browser.find_element(By.ID, "robot-stats").text
        assert console_errors(browser) == []
