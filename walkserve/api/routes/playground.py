"""GET / and /playground: the browser playground, a page and its scripts shipped in the package (no build, no CDN).

A WebSocket upgrade on ``/`` is still openpi's policy protocol (routes/openpi.py): the two
routes share the path but not the scope type. The page calls the API on the same origin only
(its Content-Security-Policy says so) and sends the API key from its tab's session as a bearer.
"""

from __future__ import annotations

from importlib import resources

from starlette.responses import Response

from walkserve.api.errors import ApiError
from walkserve.api.routes.common import router

routes = router()

# Every file the page loads, by name -> media type; nothing else under /playground/ is served.
ASSETS = {
    "playground.js": "text/javascript",
    "api.js": "text/javascript",
    "audio.js": "text/javascript",
    "playground.css": "text/css",
}
POLICY = ("default-src 'self'; img-src 'self' data: blob:; media-src 'self' blob: data:; connect-src 'self'; "
          "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'none'")
HEADERS = {"Content-Security-Policy": POLICY, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}


def _read(name: str) -> bytes:
    return resources.files("walkserve.api.playground").joinpath(name).read_bytes()


def _page() -> Response:
    return Response(_read("index.html"), media_type="text/html; charset=utf-8", headers=HEADERS)


@routes.get("/", include_in_schema=False)
async def root() -> Response:
    return _page()


@routes.get("/playground", include_in_schema=False)
async def playground() -> Response:
    return _page()


@routes.get("/playground/{name}", include_in_schema=False)
async def asset(name: str) -> Response:
    media_type = ASSETS.get(name)
    if media_type is None:
        raise ApiError(404, f"no playground file {name!r}", None, "not_found")
    return Response(_read(name), media_type=f"{media_type}; charset=utf-8", headers=HEADERS)
