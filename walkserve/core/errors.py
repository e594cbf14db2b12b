"""Typed errors raised at the edges (configuration, API, admission)."""

from __future__ import annotations


class WalkserveError(Exception):
    """Base of every error walkserve raises on purpose."""


class GraphError(WalkserveError):
    """A Walk Graph is malformed; the message names the node, edge or walk."""


class PlacementError(WalkserveError):
    """A placement file is invalid; the message names the file and the entry."""


class ConfigError(WalkserveError):
    """A model, checkpoint or runtime configuration is invalid."""


class InvalidRequest(WalkserveError):
    """A client's request is invalid. ``param`` names the offending field."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param = param
        self.code = code


class AdmissionRejected(WalkserveError):
    """The server is full: the running set and the waiting queue are at their bounds."""

    def __init__(self, message: str, retry_after_s: float = 1.0, cause: str = "queue_full"):
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.cause = cause  # queue_full | capacity (a stream the runtime cannot keep real-time) | draining


class RequestFailed(WalkserveError):
    """A request ended with an error inside the runtime (a component raised, a worker died)."""


class EngineDead(WalkserveError):
    """The runtime is not running (never started, shut down or crashed)."""
