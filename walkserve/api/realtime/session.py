"""RealtimeSession: one client's conversation. Each client event changes the session's state and queues the
server events that answer it; a bad event is answered with an ``error`` event and changes nothing.

Outgoing events go through one queue drained by the socket's writer, so a cancelled response never
interrupts a frame half-sent, and events leave in the order they were made.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from walkserve.api.errors import ApiError, to_api_error
from walkserve.api.realtime.audio_buffer import AudioBuffer, ms
from walkserve.api.realtime.conversation import (
    Conversation,
    Item,
    Part,
    decode_pcm,
    item_from_client,
)
from walkserve.api.realtime.events import error_event, event, invalid, new_id
from walkserve.api.realtime.input_transcription import transcribe_item
from walkserve.api.realtime.response import Response
from walkserve.api.realtime.session_config import RATE, SessionConfig, apply_update
from walkserve.api.realtime.speech_prefill import SpeechPrefill
from walkserve.api.realtime.vad import ServerVad
from walkserve.api.state import AppState

log = logging.getLogger(__name__)
OUTBOX = 4096  # queued server events; a response that outruns its client waits here
STALLED_S = 30.0  # a full outbox the client takes nothing from for this long: it stopped reading, the session ends
STALLED = ApiError(400, f"the client read none of the server's events for {STALLED_S:g} s; the session is closed", None,
                   "client_not_reading")


class RealtimeSession:
    def __init__(self, state: AppState, model: str):
        self.state = state
        speaks = "audio_out" in state.card.capabilities
        voice = state.check_voice(None, "voice") if speaks else None
        self.config = SessionConfig(model, voice, ["audio"] if speaks else ["text"])
        self.conversation = Conversation()
        # a committed turn is one input clip: no longer than the server's max_audio_seconds
        self.buffer = AudioBuffer(min(state.config.realtime_max_buffer_s, state.config.max_audio_seconds))
        self.vad = self._new_vad()
        self.prefill = SpeechPrefill(state, state.config.realtime_prefill_while_speaking)
        self.speech_item: str | None = None  # the id the committed speech will get
        self.speech_start = 0
        self.response: Response | None = None
        self.outbox: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(OUTBOX)
        self.closing = False
        self.ended = asyncio.Event()  # set by ``end``: the socket sends ``end_reason`` and closes
        self.transcriptions: set[asyncio.Task] = set()  # input audio transcriptions running (input_transcription.py)
        self.end_reason: ApiError | None = None
        self.handlers = {
            "session.update": self._session_update, "input_audio_buffer.append": self._append,
            "input_audio_buffer.commit": self._commit, "input_audio_buffer.clear": self._clear,
            "conversation.item.create": self._item_create, "conversation.item.delete": self._item_delete,
            "conversation.item.truncate": self._item_truncate, "conversation.item.retrieve": self._item_retrieve,
            "response.create": self._response_create, "response.cancel": self._response_cancel,
        }

    async def send(self, message: dict[str, Any]) -> None:
        """Queue an event for the client. A response outruns a slow client here; a client that stopped reading
        (nothing taken for ``STALLED_S``) ends the session, so its running response is aborted, not held open."""
        if not self.closing and not self.outbox.full():
            self.outbox.put_nowait(message)  # the common case, as cheap as it was: no timer for a put that cannot wait
        elif not self.closing:
            try:
                await asyncio.wait_for(self.outbox.put(message), STALLED_S)
            except TimeoutError:
                log.warning("realtime session: the client read nothing for %g s (%d events waiting); closing it",
                            STALLED_S, self.outbox.qsize())
                self.closing, self.end_reason = True, STALLED
                self.ended.set()
        elif not self.outbox.full():  # closing: what fits still goes out, nothing waits for a writer that may be gone
            self.outbox.put_nowait(message)

    @property
    def responding(self) -> bool:
        return self.response is not None and self.response.task is not None and not self.response.task.done()

    async def open(self) -> None:
        await self.send(event("session.created", session=self.config.describe()))

    async def close(self) -> None:
        """The client left (or the session ended): abort a running response."""
        self.closing = True
        await self.prefill.cancel()
        if self.response is not None:
            await self.response.cancel("client_cancelled")
        for task in list(self.transcriptions):
            task.cancel()
        await asyncio.gather(*self.transcriptions, return_exceptions=True)

    async def end(self, reason: ApiError, grace_s: float) -> None:
        """Ask the socket to end the session with ``reason`` once the running response is done, or after
        ``grace_s`` (then ``close`` cancels it)."""
        if self.responding:
            await asyncio.wait({self.response.task}, timeout=grace_s)
        self.end_reason = reason
        self.ended.set()

    async def handle(self, text: str) -> None:
        """One client event (a text frame); any failure becomes an ``error`` event naming the problem."""
        event_id = None
        try:
            message = parse(text)
            event_id = message.get("event_id") if isinstance(message.get("event_id"), str) else None
            kind = message.get("type")
            handler = self.handlers.get(kind) if isinstance(kind, str) else None
            if handler is None:
                raise invalid(f"unknown event type {str(kind)[:64]!r}", "type", "invalid_event_type")
            await handler(message)
        except Exception as e:
            await self.send(error_event(to_api_error(e), event_id))

    # -- session and audio ------------------------------------------------------------------------------
    async def _session_update(self, message: dict[str, Any]) -> None:
        new, old = apply_update(self.config, message.get("session"), self.state.check_voice), self.config
        self.config = new
        if new.turn_detection != old.turn_detection:
            self.vad = self._new_vad()
        await self.send(event("session.updated", session=self.config.describe()))

    def _new_vad(self) -> ServerVad | None:
        settings = self.config.turn_detection
        return ServerVad(settings, self.buffer.end) if settings else None

    async def _append(self, message: dict[str, Any]) -> None:
        self.state.require("audio_in", "audio input", "audio")
        pcm = decode_pcm(message.get("audio"), "audio", self.buffer.max_bytes)
        self.buffer.append(pcm)
        if self.vad is not None:
            for change, position in self.vad.push(pcm):
                await (self._speech_started(position) if change == "speech_started" else self._speech_stopped(position))
            if not self.vad.speaking:  # silence beyond the prefix padding is dropped, so the buffer stays small
                self.buffer.keep_from(self.buffer.end - self._padding())
        self.prefill.heard(self._speech, lambda: self.conversation.messages(self.config.instructions),
                           self.config.voice if self.config.speaks else None)

    def _padding(self) -> int:
        return self.config.turn_detection.prefix_padding_ms * RATE // 1000

    def _speech(self) -> bytes | None:
        """The audio a commit would take now (with server VAD: from the padding before the speech's start,
        while someone speaks), or None."""
        if self.vad is None:
            return bytes(self.buffer.pcm)
        if not self.vad.speaking:
            return None
        return bytes(self.buffer.pcm[max(0, self.speech_start - self._padding() - self.buffer.start) * 2 :])

    async def _speech_started(self, position: int) -> None:
        self.speech_item, self.speech_start = new_id("item"), position
        await self.send(event("input_audio_buffer.speech_started", audio_start_ms=ms(position), item_id=self.speech_item))
        if self.responding and self.config.turn_detection.interrupt_response:
            await self.response.cancel("turn_detected")  # barge-in

    async def _speech_stopped(self, position: int) -> None:
        item_id = self.speech_item or new_id("item")
        await self.send(event("input_audio_buffer.speech_stopped", audio_end_ms=ms(position), item_id=item_id))
        # up to the stop: what follows, in this append or the next, is the next turn's (the VAD goes on over it)
        await self._commit_audio(self.buffer.take(self.speech_start - self._padding(), position), item_id)
        if self.config.turn_detection.create_response:
            if self.responding:
                await self.response.cancel("turn_detected")
            await self._start_response(self.config, add=True)

    async def _commit(self, message: dict[str, Any]) -> None:
        if len(self.buffer.pcm) < RATE // 10 * 2:
            raise ApiError(400, "the input audio buffer holds less than 100 ms of audio; append more before a commit",
                           None, "input_audio_buffer_commit_empty")
        await self._commit_audio(self.buffer.take(), self.speech_item or new_id("item"))
        if self.vad is not None:
            self.vad = self._new_vad()

    async def _commit_audio(self, pcm: bytes, item_id: str) -> None:
        item = Item("user", [Part("input_audio", pcm=pcm)], id=item_id)
        previous = self.conversation.add(item)
        self.speech_item = None
        self.prefill.next_turn()
        await self.send(event("input_audio_buffer.committed", previous_item_id=previous, item_id=item.id))
        await self._announce(item, previous)
        if self.config.transcription is not None:
            task = asyncio.ensure_future(transcribe_item(self.state, item, self.config.transcription, self.send))
            self.transcriptions.add(task)
            task.add_done_callback(self.transcriptions.discard)

    async def _clear(self, message: dict[str, Any]) -> None:
        self.buffer.clear()
        self.speech_item = None
        self.prefill.next_turn()
        await self.prefill.cancel()
        self.vad = self._new_vad()
        await self.send(event("input_audio_buffer.cleared"))

    # -- conversation -----------------------------------------------------------------------------------
    async def _announce(self, item: Item, previous: str | None) -> None:
        await self.send(event("conversation.item.added", previous_item_id=previous, item=item.describe()))
        await self.send(event("conversation.item.done", previous_item_id=previous, item=item.describe()))

    async def _item_create(self, message: dict[str, Any]) -> None:
        item = item_from_client(message.get("item"), self.buffer.max_bytes)
        if any(i.id == item.id for i in self.conversation.items):
            raise invalid(f"an item {item.id!r} is already in the conversation", "item.id", "item_id_taken")
        await self._announce(item, self.conversation.add(item, message.get("previous_item_id")))

    async def _item_delete(self, message: dict[str, Any]) -> None:
        item_id = _item_id(message)
        if self.responding and self.response.item.id == item_id:
            raise invalid("the item of the running response cannot be deleted; cancel the response first", "item_id")
        self.conversation.delete(item_id)
        await self.send(event("conversation.item.deleted", item_id=item_id))

    async def _item_truncate(self, message: dict[str, Any]) -> None:
        """An assistant's spoken item, cut to what the client played: its audio ends at ``audio_end_ms`` and,
        as with the reference API, its transcript is dropped (no text the user did not hear stays in context)."""
        item = self.conversation.get(_item_id(message))
        index, end_ms = message.get("content_index", 0), message.get("audio_end_ms")
        if item.role != "assistant" or index != 0 or item.parts[0].type != "output_audio":
            raise invalid("only the audio part (content_index 0) of an assistant's spoken item can be truncated",
                          "content_index")
        if self.responding and self.response.item is item:
            raise invalid("the item of the running response cannot be truncated; cancel the response first", "item_id")
        sent_ms = ms(item.parts[0].samples)
        if isinstance(end_ms, bool) or not isinstance(end_ms, int) or not 0 <= end_ms <= sent_ms:
            raise invalid(f"audio_end_ms must be an integer in [0, {sent_ms}] (the audio sent)", "audio_end_ms")
        item.parts[0].samples = end_ms * RATE // 1000
        item.parts[0].text = ""
        await self.send(event("conversation.item.truncated", item_id=item.id, content_index=0, audio_end_ms=end_ms))

    async def _item_retrieve(self, message: dict[str, Any]) -> None:
        item = self.conversation.get(_item_id(message))
        await self.send(event("conversation.item.retrieved", item=item.describe()))

    # -- responses --------------------------------------------------------------------------------------
    async def _response_create(self, message: dict[str, Any]) -> None:
        if self.responding:
            raise invalid(f"response {self.response.id} is still running; wait for its response.done or cancel it",
                          None, "conversation_already_has_active_response")
        overrides = message.get("response") or {}
        config = apply_update(self.config, overrides, self.state.check_voice, "response")
        conversation = overrides.get("conversation", "auto") if isinstance(overrides, dict) else "auto"
        if conversation not in ("auto", "none"):
            raise invalid('response.conversation must be "auto" or "none"', "response.conversation")
        await self._start_response(config, add=conversation == "auto")

    async def _start_response(self, config: SessionConfig, add: bool) -> None:
        self.state.check_ready()  # a draining server starts no new response
        if "audio" in config.output_modalities:
            self.state.require("audio_out", "audio output", "output_modalities")
            if self.state.card.sample_rate != RATE:
                raise ApiError(400, f"this model speaks at {self.state.card.sample_rate} Hz; the realtime route sends "
                               'pcm16 at 24 kHz only: ask for output_modalities ["text"]', "output_modalities",
                               "unsupported_format")
        messages = self.conversation.messages(config.instructions)
        sources = [None] * (len(messages) - len(self.conversation.items)) + [i.id for i in self.conversation.items]
        self.response = Response(self.state, config, messages, self.send, self.conversation.add if add else None,
                                 after=self.prefill.settled, sources=sources)
        self.response.start()

    async def _response_cancel(self, message: dict[str, Any]) -> None:
        wanted = message.get("response_id")
        if not self.responding or (wanted and wanted != self.response.id):
            raise invalid("there is no such response running", "response_id", "response_cancel_not_active")
        await self.response.cancel("client_cancelled")


def parse(text: str) -> dict[str, Any]:
    try:
        message = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise invalid("the event is not valid JSON", None, "invalid_json") from None
    if not isinstance(message, dict):
        raise invalid("an event must be a JSON object with a type", None, "invalid_event")
    return message


def _item_id(message: dict[str, Any]) -> str:
    item_id = message.get("item_id")
    if not isinstance(item_id, str):
        raise invalid("item_id must be a string", "item_id")
    return item_id
