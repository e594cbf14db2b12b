"""Typed request parameters: a model declares its parameters as a msgspec struct; they are checked where they enter.

    class BagelParams(Params, frozen=True):
        cfg_text_scale: Annotated[float, Meta(ge=0.0, le=20.0)] = 4.0
        timesteps: Annotated[int, Meta(ge=2, le=1000)] = 50

The processor (``Processor.params_type``) converts a request's raw parameters
with ``parse_params``: an unknown name, a wrong type or an out-of-range value
is an ``InvalidRequest`` (HTTP 400) naming the parameter. Engine options are
checked the same way (``walkserve.core.options``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypeVar

import msgspec

from walkserve.core.errors import InvalidRequest


class Params(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every model's request parameters (no fields: a model that takes none)."""


P = TypeVar("P", bound=msgspec.Struct)
_AT = re.compile(r"at `\$\.([A-Za-z0-9_]+)")
_UNKNOWN = re.compile(r"unknown field `([^`]+)`")


def parse_params(kind: type[P], raw: Mapping[str, Any] | None, what: str = "parameter") -> P:
    """``raw`` as a ``kind``; InvalidRequest naming the offending field (``param``) otherwise."""
    try:
        return msgspec.convert(dict(raw or {}), kind)
    except msgspec.ValidationError as e:
        message = str(e)
        name = _field(message)
        if name and message.startswith("Object contains unknown field"):
            known = ", ".join(f for f in kind.__struct_fields__) or "none"
            raise InvalidRequest(f"unknown {what} {name!r} (known: {known})", param=name) from None
        raise InvalidRequest(f"{what} {name!r}: {message.split(' - at ')[0]}" if name else message, param=name) from None


def as_fields(value: msgspec.Struct) -> dict[str, Any]:
    """A struct's fields as plain values (what crosses processes in ``RequestSpec.params``)."""
    return msgspec.to_builtins(value)


def _field(message: str) -> str | None:
    m = _UNKNOWN.search(message) or _AT.search(message)
    return m.group(1) if m else None
