"""Typed request parameters: a model declares its parameters as a msgspec struct; they are checked where they enter.

    class BagelParams(Params, frozen=True, tag="bagel"):
        cfg_text_scale: Annotated[float, Meta(ge=0.0, le=20.0)] = 4.0
        timesteps: Annotated[int, Meta(ge=2, le=1000)] = 50

The processor (``Processor.params_type``) converts a request's raw parameters
with ``parse_params``: an unknown name, a wrong type or an out-of-range value
is an ``InvalidRequest`` (HTTP 400) naming the parameter. Engine options are
checked the same way (``walkserve.core.options``).

The struct itself then travels with the request, end to end: ``RequestSpec.params``,
``StartWalk.params``, the state machine, the stop rules and iteration counts
(through ``RequestParams``, beside the sampling) and each component's batch
items all hold it, and read its attributes. Each family's struct is one member of
an open tagged union: on the wire it carries its tag (the ``family`` field; the
class name unless the class sets ``tag=``), and ``decode_params`` (the protocol
codec's decode hook) turns it back into the struct whose tag it names, among the
``Params`` classes the decoding process has imported (a model module imports
its own). Fields that annotate "some family's params" use ``AnyParams``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec

from walkserve.core.errors import InvalidRequest
from walkserve.core.sampling import SamplingParams


class AnyParams:
    """What a field holding some family's ``Params`` is annotated with (msgspec decodes it with ``decode_params``)."""

    __slots__ = ()


class Params(msgspec.Struct, AnyParams, frozen=True, kw_only=True, forbid_unknown_fields=True, tag=True, tag_field="family"):
    """Base of every model's request parameters (no fields: a model that takes none)."""


@dataclass(frozen=True)
class RequestParams:
    """What a request's stop rules and iteration counts read: the model's typed params and the request's sampling."""

    model: Params = field(default_factory=Params)
    sampling: SamplingParams = field(default_factory=SamplingParams)


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


def decode_params(kind: type, obj: Any) -> Any:
    """msgspec's decode hook for ``AnyParams``: the imported ``Params`` class whose tag ``obj`` names, filled from ``obj``."""
    if kind is not AnyParams:
        raise NotImplementedError(f"no decoder for {kind!r}")
    if not isinstance(obj, dict):
        raise msgspec.ValidationError(f"params must be an object, got {type(obj).__name__}")
    tag = obj.get("family")
    matches = [c for c in _subclasses(Params) if c.__struct_config__.tag == tag]
    if len({(c.__module__, c.__qualname__) for c in matches}) != 1:  # one class (a module imported twice: its last)
        found = "no" if not matches else "several"
        raise msgspec.ValidationError(f"{found} params class with the tag {tag!r} in this process")
    return msgspec.convert(obj, matches[-1])


def _subclasses(cls: type) -> list[type]:
    out = [cls]
    for sub in cls.__subclasses__():
        out += _subclasses(sub)
    return out


def _field(message: str) -> str | None:
    m = _UNKNOWN.search(message) or _AT.search(message)
    return m.group(1) if m else None
