"""data: URLs (RFC 2397), base64 only."""

from __future__ import annotations

import base64
import binascii

from walkserve.api.errors import bad_request


def decode_base64(text: str, param: str) -> bytes:
    """Standard base64; line breaks and other whitespace in it are skipped (MIME wraps it at 76 characters)."""
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise bad_request("is not valid base64", param, "invalid_base64") from None


def parse_data_url(url: str, param: str) -> tuple[str, bytes]:
    """``data:<mime>;base64,<payload>`` -> (mime, bytes)."""
    if not url.startswith("data:"):
        raise bad_request("expected a data: URL", param, "invalid_url")
    header, sep, payload = url[5:].partition(",")
    if not sep:
        raise bad_request("malformed data: URL (no comma)", param, "invalid_url")
    parts = header.split(";")
    if "base64" not in parts[1:]:
        raise bad_request("data: URLs must be base64-encoded (';base64,')", param, "invalid_url")
    return (parts[0] or "application/octet-stream").lower(), decode_base64(payload, param)
