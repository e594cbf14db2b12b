"""Exception handlers: every error, the framework's included, leaves in one envelope."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

from walkserve.api.errors import ApiError, scrub, to_api_error
from walkserve.core.errors import WalkserveError

_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large", 415: "unsupported_media_type"}
_BRANCHES = {"str", "int", "float", "bool", "bytes", "none"}  # how pydantic names a union's plain-type branches


def param_path(loc: tuple[Any, ...]) -> str | None:
    """('body', 'messages', 0, 'content') -> 'messages[0].content'."""
    parts = list(loc[1:] if loc and loc[0] in ("body", "query", "path", "header", "form") else loc)
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part and not str(part).startswith(("function-", "tagged-union[")) and "[" not in str(part) \
                and str(part) not in _BRANCHES:
            out += f".{part}" if out else str(part)
    return out or None


def _most_telling(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """The error to answer: the first, unless it is a wrong type and its field has another error: a field of
    several types (``prompt``: a string or token ids) fails once per type, and the type the client's value has
    got further (``prompt[0]`` below 0, not "prompt: should be a valid string")."""
    first = errors[0]
    field = tuple(first.get("loc", ()))[:2]
    if not str(first.get("type", "")).endswith("_type"):
        return first
    same = [e for e in errors if tuple(e.get("loc", ()))[:2] == field]
    return next((e for e in same if not str(e.get("type", "")).endswith("_type")), first)


def _respond(error: ApiError) -> JSONResponse:
    return JSONResponse(error.envelope(), status_code=error.status, headers=error.headers)


async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
    return _respond(to_api_error(exc))


async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    first = _most_telling(errors) if errors else {"loc": (), "msg": "invalid request"}
    param = param_path(tuple(first.get("loc", ())))
    if first.get("type") == "missing" and param is None:
        message = "a request body is required"
    else:
        message = f"{param or 'body'}: {scrub(str(first.get('msg', 'invalid value')))}"
    return _respond(ApiError(400, message, param, "invalid_value"))


async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    status = exc.status_code if 400 <= exc.status_code < 600 else 500
    if status == 404:
        message = f"no route {request.method} {request.url.path}"
    elif status == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
    else:
        message = scrub(str(exc.detail)) or "request error"
    error = ApiError(status, message, None, _HTTP_CODES.get(status, "http_error"), dict(exc.headers or {}))
    return _respond(error)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(WalkserveError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(HTTPException, on_http_error)


async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    """Last resort (an error outside any route): a generic 500 envelope; the detail goes to the log."""
    return _respond(to_api_error(exc))


def install_fallback_handler(app: FastAPI) -> None:
    app.add_exception_handler(Exception, on_unexpected)
