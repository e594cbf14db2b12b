"""W3C trace context and the trace an HTTP request belongs to (stdlib only).

``traceparent: 00-<trace id: 32 hex>-<parent span id: 16 hex>-<flags: 2 hex>``; flag bit 0 is
"sampled". The HTTP layer opens a ``TraceScope`` per request and sets it in ``CURRENT``; the
engine's ``submit`` reads it there, so the requests a handler submits join that request's trace
and timeline (a contextvar: it follows the handler into the tasks it starts).
"""

from __future__ import annotations

import logging
import re
import secrets
from contextvars import ContextVar
from dataclasses import dataclass

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")


@dataclass(frozen=True)
class TraceContext:
    """One span's place in a trace: ``span_id`` is the span itself, ``parent_id`` the caller's (0: a root)."""

    trace_id: int
    span_id: int
    parent_id: int = 0
    sampled: bool = True

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-{'01' if self.sampled else '00'}"

    @property
    def trace_hex(self) -> str:
        return f"{self.trace_id:032x}"


def new_span_id() -> int:
    return int.from_bytes(secrets.token_bytes(8), "big") or 1


def parse_traceparent(value: str | None) -> tuple[int, int, bool] | None:
    """(trace id, parent span id, sampled) of a valid header; None for a missing or malformed one
    (version ff, or an all-zero id, is invalid: the server then starts a trace of its own)."""
    if not value:
        return None
    match = _TRACEPARENT.match(value.strip().lower())
    if match is None or match.group(1) == "ff" or (match.group(1) == "00" and match.group(5)):
        return None
    trace_id, parent_id = int(match.group(2), 16), int(match.group(3), 16)
    if not trace_id or not parent_id:
        return None
    return trace_id, parent_id, bool(int(match.group(4), 16) & 1)


def server_context(traceparent: str | None) -> TraceContext:
    """The server span's context: a child of the client's ``traceparent``, or the root of a new trace."""
    parsed = parse_traceparent(traceparent)
    if parsed is None:
        return TraceContext(int.from_bytes(secrets.token_bytes(16), "big") or 1, new_span_id())
    trace_id, parent_id, sampled = parsed
    return TraceContext(trace_id, new_span_id(), parent_id, sampled)


@dataclass(frozen=True)
class TraceScope:
    """What the HTTP layer knows of the request it serves: its id (``X-Request-Id``) and, with
    tracing on, its server span's context."""

    key: str
    context: TraceContext | None = None


CURRENT: ContextVar[TraceScope | None] = ContextVar("walkserve_trace_scope", default=None)


def install_log_context() -> None:
    """Every log record gets ``trace``: `` request_id=... trace_id=... span_id=...`` of the HTTP request
    it was logged in ('' outside one), for a format's ``%(trace)s``."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "walkserve_trace", False):
        return

    def factory(*args, **kwargs) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        scope = CURRENT.get()
        record.trace = _log_fields(scope) if scope is not None else ""
        return record

    factory.walkserve_trace = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


def _log_fields(scope: TraceScope) -> str:
    ctx = scope.context
    ids = f" trace_id={ctx.trace_hex} span_id={ctx.span_id:016x}" if ctx is not None else ""
    return f" request_id={scope.key}{ids}"
