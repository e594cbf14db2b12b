"""POST /v1/completions and POST /v1/chat/completions."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from walkserve.api.disconnect import race_disconnect
from walkserve.api.openai.chat import chat_collect, chat_stream, plan_chat
from walkserve.api.openai.completions import completion_collect, completion_stream, plan_completion
from walkserve.api.routes.common import ERRORS, collect, router, stream
from walkserve.api.schemas.chat import ChatCompletionRequest
from walkserve.api.schemas.completions import CompletionRequest
from walkserve.api.sse import sse_error_then_done
from walkserve.api.state import app_state

routes = router()
SSE = "text/event-stream"


@routes.post("/v1/completions", responses=ERRORS, summary="OpenAI text completions (SSE when stream=true)")
async def completions(body: CompletionRequest, request: Request) -> Response:
    state = app_state(request)
    state.check_ready()
    state.check_model(body.model)
    state.require("completions", "text completions")
    plan = await race_disconnect(request.receive, plan_completion(state, body))  # a long prompt's client may leave
    if body.stream:
        return stream(completion_stream(state, plan), SSE, sse_error_then_done)
    return await collect(request, completion_collect(state, plan))


@routes.post("/v1/chat/completions", responses=ERRORS, summary="OpenAI chat completions, text and audio out")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    state = app_state(request)
    state.check_ready()
    state.check_model(body.model)
    state.require("chat", "chat completions")
    plan = await race_disconnect(request.receive, plan_chat(state, body))
    if body.stream:
        return stream(chat_stream(state, plan), SSE, sse_error_then_done)
    return await collect(request, chat_collect(state, plan))
