"""A strict JSON parser for request bodies: no NaN/Infinity, no overflowing numbers, bounded depth."""

from __future__ import annotations

import json
import math
from typing import Any

from walkserve.api.errors import ApiError

MAX_DEPTH = 64


class _NonFinite(ValueError):
    """NaN, Infinity, or a number that overflows a float."""


class _Marker:
    """Stands in for a non-finite number in the second, locating parse."""


def _reject_constant(name: str) -> Any:
    raise _NonFinite(f"{name} is not valid JSON (numbers must be finite)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NonFinite(f"number {text[:32]} is out of range (numbers must be finite)")
    return value


def _mark_float(text: str) -> Any:
    value = float(text)
    return value if math.isfinite(value) else _Marker()


def _find_marker(value: Any, path: str = "") -> str | None:
    """The field path ("messages[0].temperature") of the first non-finite number."""
    if isinstance(value, _Marker):
        return path or None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        child_path = f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else str(key))
        if (found := _find_marker(child, child_path)) is not None:
            return found
    return None


def _locate_non_finite(text: str) -> str | None:
    try:
        return _find_marker(json.loads(text, parse_constant=lambda _: _Marker(), parse_float=_mark_float))
    except (ValueError, RecursionError):
        return None


def _depth(value: Any, level: int = 0) -> int:
    if level > MAX_DEPTH:
        return level
    if isinstance(value, dict):
        return max((_depth(v, level + 1) for v in value.values()), default=level + 1)
    if isinstance(value, list):
        return max((_depth(v, level + 1) for v in value), default=level + 1)
    return level


def loads_strict(body: bytes) -> Any:
    """Parse a request body; raises ApiError(400, code="invalid_json") with a client-safe message."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "the request body is not valid UTF-8", None, "invalid_json") from None
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError:
        raise ApiError(400, "the JSON body is nested too deeply", None, "invalid_json") from None
    except _NonFinite as e:
        param = _locate_non_finite(text)
        raise ApiError(400, f"{param or 'body'}: {e}", param, "invalid_number") from None
    except ValueError as e:  # JSONDecodeError is a ValueError; so are the hooks' errors
        detail = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
        where = f" at position {e.pos}" if isinstance(e, json.JSONDecodeError) else ""
        raise ApiError(400, f"the request body is not valid JSON: {detail}{where}", None, "invalid_json") from None
    if _depth(value) > MAX_DEPTH:
        raise ApiError(400, f"the JSON body is nested deeper than {MAX_DEPTH} levels", None, "invalid_json")
    return value
