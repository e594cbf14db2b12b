"""StrictRoute: every route reads its body once, under the size cap, and parses JSON strictly.

FastAPI's own parser takes NaN and Infinity; here a JSON route first checks
the content type (415), then parses with ``loads_strict`` (400 on NaN,
Infinity, overflowing numbers, deep nesting) and hands FastAPI the parsed
value to validate against the route's pydantic model. Unexpected exceptions
are logged and become a generic 500 envelope.
"""

from __future__ import annotations

import email.message
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import params
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from walkserve.api.disconnect import ClientGone
from walkserve.api.errors import ApiError, to_api_error
from walkserve.api.strict_json import loads_strict
from walkserve.core.errors import WalkserveError

log = logging.getLogger(__name__)

Handler = Callable[[Request], Coroutine[Any, Any, Response]]
CLIENT_GONE = 499


def is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


async def read_json(request: Request) -> Any:
    if not is_json(request.headers.get("content-type")):
        raise ApiError(415, "send the body as JSON with 'Content-Type: application/json'", None, "unsupported_media_type")
    body = await request.body()
    if not body.strip():
        raise ApiError(400, "the request body is empty; a JSON object is required", None, "missing_body")
    return loads_strict(body)


def is_form(content_type: str | None) -> bool:
    kind = (content_type or "").split(";")[0].strip().lower()
    return kind in ("multipart/form-data", "application/x-www-form-urlencoded")


async def read_form_body(request: Request) -> None:
    if not is_form(request.headers.get("content-type")):
        raise ApiError(415, "send this route's body as multipart/form-data", None, "unsupported_media_type")
    await request.body()  # read under the size cap before FastAPI parses the form


class StrictRoute(APIRoute):
    def get_route_handler(self) -> Handler:
        inner = super().get_route_handler()
        form_body = self.body_field is not None and isinstance(self.body_field.field_info, (params.Form, params.File))
        json_body = self.body_field is not None and not form_body

        async def handler(request: Request) -> Response:
            try:
                if request.method in ("POST", "PUT", "PATCH"):
                    if json_body:
                        request._json = await read_json(request)  # FastAPI validates this parsed value
                    elif form_body:
                        await read_form_body(request)
                    else:
                        await request.body()
                return await inner(request)
            except (ClientDisconnect, ClientGone):  # ClientGone: gone while its request was planned (text.py)
                return Response(status_code=CLIENT_GONE)
            except (ApiError, HTTPException, RequestValidationError, WalkserveError):
                raise  # the app's exception handlers answer these
            except Exception as e:
                raise to_api_error(e) from None

        return handler
