"""ApiError: an HTTP error with OpenAI's envelope ``{"error": {message, type, param, code}}``."""

from __future__ import annotations

import logging
import re
from typing import Any

_log = logging.getLogger("walkserve.api")

_PATH = re.compile(r"(?:[A-Za-z]:)?(?:/[\w.\-]+){2,}/?")
_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]{4,}\b")

# status -> OpenAI-style error type
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable_error",
}


def scrub(message: str, limit: int = 300) -> str:
    """A message safe to show a client: first line, no file paths or memory addresses, bounded."""
    line = (message or "").strip().splitlines()[0] if (message or "").strip() else ""
    line = _ADDRESS.sub("<addr>", _PATH.sub("<path>", line))
    return line[:limit]


class ApiError(Exception):
    """An error answered to the client; ``headers`` ride along (Retry-After, Allow ...)."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    @property
    def type(self) -> str:
        return ERROR_TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")

    def envelope(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = "invalid_value") -> ApiError:
    return ApiError(400, message, param, code)


def busy(message: str, retry_after_s: float) -> ApiError:
    seconds = max(1, int(retry_after_s + 0.999))
    return ApiError(429, message, None, "server_busy", {"Retry-After": str(seconds)})


def unavailable(message: str, code: str = "unavailable") -> ApiError:
    return ApiError(503, message, None, code)


def internal(request_id: str | None = None) -> ApiError:
    suffix = f" (request {request_id})" if request_id else ""
    return ApiError(500, f"internal server error{suffix}; the server log has the details", None, "internal_error")


def to_api_error(exc: BaseException) -> ApiError:
    """Any exception as the error the client sees; unexpected ones are logged and answered 500."""
    from walkserve.core.errors import AdmissionRejected, EngineDead, InvalidRequest, RequestFailed

    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, InvalidRequest):
        return ApiError(400, scrub(str(exc)) or "invalid request", exc.param, exc.code or "invalid_value")
    if isinstance(exc, AdmissionRejected):
        return busy(f"the server is at capacity ({scrub(str(exc))}); retry later", exc.retry_after_s)
    if isinstance(exc, EngineDead):
        return unavailable("the model runtime is not running", "engine_dead")
    if isinstance(exc, RequestFailed):
        _log.warning("request failed in the runtime: %s", exc)
        return ApiError(500, f"the request failed inside the runtime: {scrub(str(exc))}", None, "request_failed")
    _log.error("unexpected error while serving a request", exc_info=exc)
    return internal()
