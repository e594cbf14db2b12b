"""Response: one ``response.create`` run as the ``/v1/chat/completions`` request of the conversation so far.

The chat route's own planning (``plan_chat``) and choice driving (``drive_choices``) run it, with
``modalities ["text", "audio"]`` (or ``["text"]``), ``stream`` and pcm16 audio; so with the same sampling
its transcript and audio are the chat route's. Event order (a spoken answer; text-only swaps the audio
events for ``response.output_text.delta`` / ``.done``)::

    response.created
    response.output_item.added        conversation.item.added
    response.content_part.added
    response.output_audio_transcript.delta* / response.output_audio.delta*   (as they come)
    response.output_audio.done        response.output_audio_transcript.done
    response.content_part.done
    response.output_item.done         conversation.item.done
    response.done                     status completed | incomplete | cancelled | failed, with usage

Cancelling the task (``response.cancel``, barge-in, a client that left) closes the chat events, which aborts
the request in the runtime; the item keeps what was sent (status ``incomplete``).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable
from typing import Any

from walkserve.api.audio.pcm import pcm16_base64
from walkserve.api.errors import ApiError, to_api_error
from walkserve.api.openai.chat import plan_chat
from walkserve.api.openai.choices import ChoiceUpdate, drive_choices, usage
from walkserve.api.openai.text_plan import TextPlan
from walkserve.api.realtime.conversation import Item, Part
from walkserve.api.realtime.events import error_event, event, new_id
from walkserve.api.realtime.session_config import PCM, SessionConfig
from walkserve.api.schemas.chat import ChatCompletionRequest
from walkserve.api.state import AppState

ROUTE = "/v1/realtime"
Send = Callable[[dict[str, Any]], Awaitable[None]]


def chat_body(config: SessionConfig) -> ChatCompletionRequest:
    """The chat completion a client would send for this response; its messages are passed to ``plan_chat``
    already converted, so the one here only satisfies the schema."""
    speaks = config.speaks
    return ChatCompletionRequest.model_validate({
        "messages": [{"role": "user"}], "stream": True,
        "modalities": ["text", "audio"] if speaks else ["text"],
        "audio": {"voice": config.voice, "format": "pcm16", "max_frames": config.max_audio_frames} if speaks else None,
        "temperature": config.temperature, "top_p": config.top_p, "seed": config.seed,
        "max_completion_tokens": config.max_output_tokens,
    })


def realtime_usage(chat: dict[str, Any]) -> dict[str, Any]:
    details = chat.get("completion_tokens_details") or {}
    return {"total_tokens": chat["total_tokens"], "input_tokens": chat["prompt_tokens"],
            "output_tokens": chat["completion_tokens"],
            "output_token_details": {"text_tokens": details.get("text_tokens", chat["completion_tokens"]),
                                     "audio_tokens": details.get("audio_tokens", 0)}}


def as_items(error: ApiError, sources: list[str | None]) -> ApiError:
    """An error of a response's chat request, its ``messages[i]`` param told as what the client sent: the
    conversation item behind message i (``sources[i]``; param ``item.content[j]...``, the item's id in the
    message), or the session's instructions (``sources[i]`` None)."""
    found = re.fullmatch(r"messages\[(\d+)\](.*)", error.param or "")
    if found is None or int(found[1]) >= len(sources):
        return error
    source, rest = sources[int(found[1])], found[2]
    if source is None:
        return ApiError(error.status, error.message, "session.instructions", error.code)
    return ApiError(error.status, f"conversation item {source}: {error.message}", f"item{rest}", error.code)


class Response:
    def __init__(self, state: AppState, config: SessionConfig, messages: list[dict[str, Any]], send: Send,
                 add_item: Callable[[Item], str | None] | None, after: Callable[[], Awaitable[None]] | None = None,
                 sources: list[str | None] | None = None):
        self.state, self.config, self.messages, self.send = state, config, messages, send
        self.sources = sources or []  # per message: the conversation item it is (None: the instructions)
        self.after = after  # awaited before the request is made (the session's prefill of this turn's speech)
        self.add_item = add_item  # None: an out-of-band response (conversation "none")
        self.id = new_id("resp")
        kind = "output_audio" if config.speaks else "output_text"
        self.item = Item("assistant", [Part(kind, text="")], status="in_progress")
        self.usage: dict[str, Any] | None = None
        self.status, self.details = "in_progress", None
        self.cancel_reason = "client_cancelled"
        self.opened = False  # the output item was announced
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        self.task = asyncio.ensure_future(self.run())

    async def cancel(self, reason: str) -> None:
        """End the response now (its request is aborted) and wait until its last events are queued."""
        if self.task is None or self.task.done():
            return
        self.cancel_reason = reason
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task

    def describe(self) -> dict[str, Any]:
        return {"id": self.id, "object": "realtime.response", "status": self.status, "status_details": self.details,
                "output": [self.item.describe()] if self.opened else [],
                "conversation_id": None if self.add_item is None else "conv_default",
                "output_modalities": self.config.output_modalities, "max_output_tokens": self.config.max_output_tokens or "inf",
                "audio": {"output": {"format": PCM, "voice": self.config.voice}}, "usage": self.usage, "metadata": None}

    async def run(self) -> None:
        await self.send(event("response.created", response=self.describe()))
        try:
            if self.after is not None:
                await self.after()
            plan = await plan_chat(self.state, chat_body(self.config), self.messages)
            await self._open()
            self.status = await self._stream(plan)
        except asyncio.CancelledError:
            self.status, self.details = "cancelled", {"type": "cancelled", "reason": self.cancel_reason}
        except Exception as e:
            error = as_items(to_api_error(e), self.sources)
            self.status = "failed"
            self.details = {"type": "failed", "error": {"type": error.type, "code": error.code, "message": error.message}}
            await self.send(error_event(error))
        if self.opened:
            await self._close_item()
        await self.send(event("response.done", response=self.describe()))

    def _where(self, **more: Any) -> dict[str, Any]:
        return {"response_id": self.id, "item_id": self.item.id, "output_index": 0, "content_index": 0, **more}

    async def _open(self) -> None:
        self.opened = True
        added = {"response_id": self.id, "output_index": 0, "item": self.item.describe()}
        await self.send(event("response.output_item.added", **added))
        if self.add_item is not None:
            previous = self.add_item(self.item)
            await self.send(event("conversation.item.added", previous_item_id=previous, item=self.item.describe()))
        part = {"type": "audio", "transcript": ""} if self.config.speaks else {"type": "text", "text": ""}
        await self.send(event("response.content_part.added", **self._where(part=part)))

    async def _stream(self, plan: TextPlan) -> str:
        finish = None
        updates = drive_choices(self.state.runner, plan.specs, plan.trackers, ROUTE)
        async with contextlib.aclosing(updates):
            async for update in updates:
                await self._deltas(update)
                if self.config.speaks and update.audio is not None:  # the stream's playback clock (api/playback.py)
                    self.state.runner.written(plan.specs[update.index].id, len(update.audio))
                finish = update.finish_reason or finish
        self.usage = realtime_usage(usage(plan.trackers))
        if finish == "length":
            self.details = {"type": "incomplete", "reason": "max_output_tokens"}
            return "incomplete"
        return "completed"

    async def _deltas(self, update: ChoiceUpdate) -> None:
        if update.text:
            self.item.parts[0].text += update.text
            kind = "response.output_audio_transcript.delta" if self.config.speaks else "response.output_text.delta"
            await self.send(event(kind, **self._where(delta=update.text)))
        if self.config.speaks and update.audio is not None and len(update.audio):
            self.item.parts[0].samples += len(update.audio)
            await self.send(event("response.output_audio.delta", **self._where(delta=pcm16_base64(update.audio))))

    async def _close_item(self) -> None:
        part = self.item.parts[0]
        self.item.status = "completed" if self.status == "completed" else "incomplete"
        if self.config.speaks:
            await self.send(event("response.output_audio.done", **self._where()))
            await self.send(event("response.output_audio_transcript.done", **self._where(transcript=part.text)))
            done_part = {"type": "audio", "transcript": part.text}
        else:
            await self.send(event("response.output_text.done", **self._where(text=part.text)))
            done_part = {"type": "text", "text": part.text}
        await self.send(event("response.content_part.done", **self._where(part=done_part)))
        item = self.item.describe()
        await self.send(event("response.output_item.done", response_id=self.id, output_index=0, item=item))
        if self.add_item is not None:
            await self.send(event("conversation.item.done", item=item))
