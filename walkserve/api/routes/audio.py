"""POST /v1/audio/speech."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from walkserve.api.openai.speech import plan_speech, speech_bytes, speech_events, speech_file
from walkserve.api.routes.common import ERRORS, collect, router, stream
from walkserve.api.schemas.speech import SpeechRequest
from walkserve.api.sse import sse_error
from walkserve.api.state import app_state

routes = router()

AUDIO_RESPONSE = {200: {"content": {"audio/mpeg": {}, "audio/wav": {}, "text/event-stream": {}}, "description": "Audio bytes or SSE"}}


@routes.post("/v1/audio/speech", responses={**ERRORS, **AUDIO_RESPONSE}, response_class=Response, summary="Text to speech")
async def speech(body: SpeechRequest, request: Request) -> Response:
    state = app_state(request)
    state.check_ready()
    state.check_model(body.model)
    plan = await plan_speech(state, body)
    if body.stream_format == "sse":
        return stream(speech_events(state, plan), "text/event-stream", sse_error)
    media_type = plan.format.media_type
    if body.stream_format == "audio" and plan.format.incremental:
        return stream(speech_bytes(state, plan), media_type, None)
    return await collect(request, speech_file(state, plan), lambda data: Response(data, media_type=media_type))
