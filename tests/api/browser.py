"""Headless Chromium for the playground tests: Debian's ``chromium`` and ``chromium-driver`` driven by selenium.

No browser is downloaded: the driver binary is named explicitly, so selenium's
manager never runs. Where the browser is missing the tests skip, except in CI
(``CI`` set), where they fail: ``.ci/run`` installs it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

CHROMIUM = os.environ.get("WALKSERVE_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("WALKSERVE_CHROMEDRIVER", "/usr/bin/chromedriver")


def _require_browser() -> None:
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not shutil.which(path)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium package")
    if missing:
        why = f"headless browser test needs {', '.join(missing)} (apt-get install chromium chromium-driver)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium WebDriver with its console log kept (``console_errors``)."""
    _require_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--autoplay-policy=no-user-gesture-required", "--window-size=1200,900"):
        options.add_argument(arg)
    profile = tempfile.mkdtemp(prefix="walkserve-chromium-")
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        driver.set_script_timeout(120)
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def console_errors(driver) -> list[str]:
    """Console messages at error level since the last call."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def wait_until(driver, condition: Callable[[Any], Any], timeout: float = 120, what: str = "",
               banner_fails: bool = True) -> Any:
    """Poll ``condition(driver)`` until truthy; the page's error banner, if shown, is the failure message
    (unless ``banner_fails`` is false: a test waiting for the banner itself)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition(driver)
        if value:
            return value
        banner = banner_fails and driver.execute_script(
            "const e = document.getElementById('error'); return e && !e.hidden ? e.textContent : null")
        if banner:
            raise AssertionError(f"the page shows an error while waiting for {what}: {banner}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)
