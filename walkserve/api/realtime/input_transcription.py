"""Input audio transcription: each committed user turn transcribed by the served model, as ``/v1/audio/transcriptions``.

With ``audio.input.transcription`` set, a commit (the client's, or server VAD's) starts a chat completion of the
transcription route's prompt (``transcription_prompt.py``: the clip, then "Transcribe the audio into text ...", its
``language`` hint and ``prompt`` context) on the committed audio, greedy, beside the session's response. Its text
streams out as the GA events::

    conversation.item.input_audio_transcription.delta      item_id, content_index 0, delta
    conversation.item.input_audio_transcription.completed  item_id, content_index 0, transcript, usage (tokens)
    conversation.item.input_audio_transcription.failed     item_id, content_index 0, error   (instead, on failure)

and the item's audio part gets the transcript (``conversation.item.retrieve`` shows it). The transcript is the
transcription route's for the same audio, token for token; it never enters the conversation's prompt (the model
hears the audio itself).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from walkserve.api.errors import to_api_error
from walkserve.api.openai.chat import plan_chat
from walkserve.api.openai.choices import drive_choices, usage
from walkserve.api.openai.transcription_prompt import instruction, language_name
from walkserve.api.realtime.conversation import Item
from walkserve.api.realtime.events import event
from walkserve.api.realtime.response import ROUTE, Send
from walkserve.api.realtime.session_config import InputTranscription
from walkserve.api.schemas.chat import ChatCompletionRequest
from walkserve.api.state import AppState

PREFIX = "conversation.item.input_audio_transcription"


def transcription_messages(item: Item, settings: InputTranscription) -> list[dict[str, Any]]:
    """The processor's messages of the transcription route's prompt for ``item``'s audio."""
    text = instruction("transcribe", language_name(settings.language), settings.prompt)
    return [{"role": "user", "content": [item.parts[0].payload(), {"type": "text", "text": text}]}]


async def transcribe_item(state: AppState, item: Item, settings: InputTranscription, send: Send) -> None:
    """Transcribe the committed ``item``, sending its delta events and then completed (or failed)."""
    where = {"item_id": item.id, "content_index": 0}
    body = ChatCompletionRequest.model_validate({"messages": [{"role": "user"}], "temperature": 0.0})
    transcript = ""
    try:
        plan = await plan_chat(state, body, transcription_messages(item, settings))
        updates = drive_choices(state.runner, plan.specs, plan.trackers, ROUTE)
        async with contextlib.aclosing(updates):
            async for update in updates:
                if update.text:
                    transcript += update.text
                    await send(event(f"{PREFIX}.delta", **where, delta=update.text))
    except asyncio.CancelledError:
        raise
    except Exception as e:
        error = to_api_error(e)
        body_error = {"type": error.type, "code": error.code, "message": error.message, "param": error.param}
        await send(event(f"{PREFIX}.failed", **where, error=body_error))
        return
    item.parts[0].text = transcript
    counts = usage(plan.trackers)
    tokens = {"type": "tokens", "input_tokens": counts["prompt_tokens"], "output_tokens": counts["completion_tokens"],
              "total_tokens": counts["total_tokens"]}
    await send(event(f"{PREFIX}.completed", **where, transcript=transcript, usage=tokens))
