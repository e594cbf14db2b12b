"""POST /v1/audio/transcriptions and POST /v1/audio/translations (multipart, OpenAI's shape)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import File, Form, UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from walkserve.api.openai.transcript_formats import MEDIA_TYPES, render
from walkserve.api.openai.transcription_prompt import LANGUAGES
from walkserve.api.openai.transcriptions import (
    ROUTES,
    TranscriptionForm,
    plan_transcription,
    transcribe,
    transcription_events,
)
from walkserve.api.routes.common import ERRORS, collect, router, stream
from walkserve.api.schemas.transcriptions import TranscriptionJson, TranscriptionVerboseJson
from walkserve.api.sse import sse_error
from walkserve.api.state import app_state

routes = router()

ResponseFormat = Literal["json", "text", "srt", "verbose_json", "vtt"]
TEXT_RESPONSE = {200: {"model": TranscriptionJson | TranscriptionVerboseJson, "description": "json/verbose_json: a JSON object; text/srt: text; vtt: WebVTT; stream=true: SSE "
                                      "(transcript.text.delta events, then transcript.text.done)",
                       "content": {"application/json": {}, "text/plain": {}, "text/vtt": {}, "text/event-stream": {}}}}
FILE_DOC = "The audio file: wav, flac, mp3, ogg (what libsndfile decodes)."
LANGUAGE_DOC = f"ISO-639-1 code of the audio's language (a hint put into the prompt): {', '.join(LANGUAGES)}."
PROMPT_DOC = "Text to guide spelling and style (e.g. the previous segment's transcript); put into the prompt."
TEMPERATURE_DOC = "Sampling temperature; 0 (the default) is greedy."


async def _serve(request: Request, form: TranscriptionForm) -> Response:
    state = app_state(request)
    state.check_ready()
    state.check_model(form.model)
    plan = await plan_transcription(state, form)
    if form.stream:
        return stream(transcription_events(state, plan), "text/event-stream", sse_error)

    def respond(text: str) -> Response:
        body = render(plan, text)
        if isinstance(body, dict):
            return JSONResponse(body)
        return Response(body, media_type=MEDIA_TYPES[form.response_format])

    return await collect(request, transcribe(state, plan), respond)


@routes.post(ROUTES["transcribe"], responses={**ERRORS, **TEXT_RESPONSE}, response_class=Response,
             summary="Speech to text (multipart form)")
async def transcriptions(
    request: Request,
    file: Annotated[UploadFile, File(description=FILE_DOC)],
    model: Annotated[str | None, Form(max_length=256)] = None,
    language: Annotated[str | None, Form(max_length=16, description=LANGUAGE_DOC)] = None,
    prompt: Annotated[str | None, Form(max_length=32000, description=PROMPT_DOC)] = None,
    response_format: Annotated[ResponseFormat, Form()] = "json",
    temperature: Annotated[float, Form(ge=0, le=2, allow_inf_nan=False, description=TEMPERATURE_DOC)] = 0.0,
    stream: Annotated[bool, Form(description="Stream the transcript as server-sent events")] = False,
) -> Response:
    form = TranscriptionForm("transcribe", await file.read(), file.filename, model, language, prompt, response_format,
                             temperature, stream)
    return await _serve(request, form)


@routes.post(ROUTES["translate"], responses={**ERRORS, **TEXT_RESPONSE}, response_class=Response,
             summary="Speech to English text (multipart form)")
async def translations(
    request: Request,
    file: Annotated[UploadFile, File(description=FILE_DOC)],
    model: Annotated[str | None, Form(max_length=256)] = None,
    language: Annotated[str | None, Form(max_length=16, description="walkserve extension: " + LANGUAGE_DOC)] = None,
    prompt: Annotated[str | None, Form(max_length=32000, description=PROMPT_DOC)] = None,
    response_format: Annotated[ResponseFormat, Form()] = "json",
    temperature: Annotated[float, Form(ge=0, le=2, allow_inf_nan=False, description=TEMPERATURE_DOC)] = 0.0,
    stream: Annotated[bool, Form(description="walkserve extension: stream as transcriptions do")] = False,
) -> Response:
    form = TranscriptionForm("translate", await file.read(), file.filename, model, language, prompt, response_format,
                             temperature, stream)
    return await _serve(request, form)
