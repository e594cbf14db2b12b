"""The playground's page and scripts over HTTP (the browser itself: test_playground_browser_*.py)."""

from __future__ import annotations

import re

import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from tests.api.helpers import asgi_client, assert_envelope
from walkserve.api import build_app
from walkserve.api.openpi.policy_socket import POLICY_VIOLATION
from walkserve.api.routes.playground import ASSETS
from walkserve.testing.fake_engine import FakeEngine, FakeEngineConfig


@pytest.mark.parametrize("path", ["/", "/playground"])
async def test_page_is_served_same_origin_only(path):
    async with asgi_client() as client:
        r = await client.get(path)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "<title>walkserve playground</title>" in r.text
    policy = r.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "connect-src 'self'" in policy
    assert "http" not in policy  # no other origin, no CDN


async def test_every_script_the_page_loads_is_served_and_nothing_else():
    async with asgi_client() as client:
        page = (await client.get("/")).text
        scripts = set(re.findall(r'(?:src|href)="/playground/([\w.]+)"', page))
        for name in ASSETS:
            source = (await client.get(f"/playground/{name}")).text
            scripts |= set(re.findall(r'from "/playground/([\w.]+)"', source))
        assert scripts == set(ASSETS)
        for name, media_type in ASSETS.items():
            r = await client.get(f"/playground/{name}")
            assert r.status_code == 200 and r.headers["content-type"].startswith(media_type) and r.content
            assert "https://" not in r.text and "http://" not in r.text
        assert_envelope(await client.get("/playground/..%2Fapp.py"), 404)
        assert_envelope(await client.get("/playground/index.html"), 404)


async def test_page_is_open_but_the_api_behind_it_needs_the_key():
    async with asgi_client(api_key="sekrit") as client:
        assert (await client.get("/")).status_code == 200
        assert (await client.get("/playground/api.js")).status_code == 200
        assert_envelope(await client.get("/v1/models"), 401)
        ok = await client.get("/v1/models", headers={"Authorization": "Bearer sekrit"})
        assert ok.status_code == 200


def test_websocket_on_root_is_still_openpi():
    """A model without ``act`` refuses openpi's handshake with 1008 (policy_socket), not the page's 404/HTML."""
    app = build_app(FakeEngine(FakeEngineConfig()))
    with TestClient(app) as client, pytest.raises(WebSocketDisconnect) as refused, client.websocket_connect("/"):
        pass
    assert refused.value.code == POLICY_VIOLATION


@pytest.mark.parametrize(("ci", "outcome"), [("true", pytest.fail.Exception), ("", pytest.skip.Exception)])
def test_browser_tests_fail_in_ci_without_a_browser(monkeypatch, ci, outcome):
    from tests.api import browser

    monkeypatch.setattr(browser, "CHROMIUM", "/nonexistent/chromium")
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="chromium"), browser.chromium():
        pass
