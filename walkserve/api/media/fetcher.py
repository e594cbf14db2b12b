"""Remote media: fetched only from URL prefixes on the configured allowlist, bounded in size and time."""

from __future__ import annotations

import httpx

from walkserve.api.errors import ApiError, bad_request
from walkserve.api.media.data_url import parse_data_url


def _normalized(url: str) -> str | None:
    """The URL exactly as it will be fetched (dot segments resolved), or None when it is not
    a plain http(s) URL: credentials, encoded dots or slashes and backslashes are refused."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError):
        return None
    target = parsed.raw_path.decode("ascii", "replace")
    path = target.split("?", 1)[0]
    if parsed.scheme not in ("http", "https") or not parsed.host or parsed.userinfo or "\\" in url:
        return None
    if any(marker in path.lower() for marker in ("%2e", "%2f", "%5c")):
        return None
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.scheme}://{parsed.host}{port}{target or '/'}"


class MediaFetcher:
    """Turns a media URL into bytes: data URLs always, http(s) only under an allowlisted prefix."""

    def __init__(self, allowlist: tuple[str, ...], max_bytes: int, timeout_s: float):
        self.allowlist = tuple(_normalized(p) or p for p in allowlist)
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    def allowed(self, url: str) -> bool:
        norm = _normalized(url)
        return norm is not None and any(norm.startswith(prefix) for prefix in self.allowlist)

    async def get(self, url: str, param: str) -> bytes:
        if url.startswith("data:"):
            return parse_data_url(url, param)[1]
        if not self.allowlist:
            raise bad_request("remote media URLs are disabled on this server; send a data: URL", param, "url_not_allowed")
        if not self.allowed(url):
            raise bad_request("this URL is not on the server's media allowlist", param, "url_not_allowed")
        return await self._download(_normalized(url) or url, param)

    async def _download(self, url: str, param: str) -> bytes:
        chunks, size = [], 0
        try:
            client = httpx.AsyncClient(follow_redirects=False, timeout=self.timeout_s)
            async with client, client.stream("GET", url) as response:
                if response.status_code != 200:
                    raise bad_request(f"fetching the media URL answered HTTP {response.status_code}", param, "fetch_failed")
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise bad_request(f"the media at this URL is larger than {self.max_bytes} bytes", param, "media_too_large")
                    chunks.append(chunk)
        except ApiError:
            raise
        except httpx.HTTPError as e:
            raise bad_request(f"could not fetch the media URL ({type(e).__name__})", param, "fetch_failed") from None
        return b"".join(chunks)
