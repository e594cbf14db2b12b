"""SpeechPrefill: the conversation and the audio heard so far, prefilled while the user still speaks.

The audio encoder attends only inside windows (``ModelCard.audio_window_s``: 8 s for the Qwen3-Omni
release), so a window heard whole has final features, tokens and thinker rows. Each time the speech of
the turn (what a commit would take now) holds one more whole window, plus ``LOOKAHEAD_S`` for the last
features' reach past the window's end, the conversation so far with that speech as the last user item
runs as a greedy answer of one token (spoken when the session answers spoken). Its prompt rows land in the
runtime's prefix cache (keyed on content: per window, ``content_keys.py``), its encoded windows in the
encoder's cache and, spoken, its media pieces' captured thinker rows (what the talker reads) in the KV
engine's capture cache, per window; then its answer is dropped. The committed turn's response is the
same request it always was; it finds every window whose features came out the same as a hit, so on commit only the last, incomplete window and the rows after it
are computed:

    heard:   |---- window 0 ----|---- window 1 ----|-- tail --|   (commit)
    prefill:                  P0 (window 0)        P1 (windows 0-1, hits window 0)
    commit:  window 0, 1 from the caches, the tail computed

At most one prefill runs per session; when it ends, the next starts if the speech has grown by a whole
window meanwhile (so a client that sends faster than real time still gets its windows prefilled). A
response waits for a running prefill (its rows are the response's prefix). A prefill that fails costs
only the time it saved; answers never depend on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from walkserve.api.openai.chat import plan_chat
from walkserve.api.openai.choices import drive_choices
from walkserve.api.realtime.conversation import Part
from walkserve.api.realtime.session_config import RATE
from walkserve.api.schemas.chat import ChatCompletionRequest
from walkserve.api.state import AppState

log = logging.getLogger("walkserve.realtime")
ROUTE = "/v1/realtime:prefill"  # the route label of these requests in /metrics (apart from the responses)
LOOKAHEAD_S = 0.05  # a window's last feature frames read 12.5 ms past it; the 24 -> 16 kHz filter 1 ms more
BODY = {"messages": [{"role": "user"}], "stream": True, "modalities": ["text"], "temperature": 0,
        "max_completion_tokens": 1}


def body(voice: str | None) -> ChatCompletionRequest:
    """The prefill's request: a text answer of one token, or for a session that answers spoken, a spoken one of two, so
    its media pieces capture the thinker rows the talker reads and the KV engine's capture cache keeps them per
    encoder window (``engines/kv/capture_cache.py``) for the committed turn's spoken answer."""
    spoken = {"modalities": ["text", "audio"], "audio": {"voice": voice, "format": "pcm16", "max_frames": 1},
              "max_completion_tokens": 2} if voice else {}  # a spoken answer's least: its audio is thrown away
    return ChatCompletionRequest.model_validate({**BODY, **spoken})


class SpeechPrefill:
    def __init__(self, state: AppState, enabled: bool):
        window = state.card.audio_window_s
        self.state = state
        self.window_s = window if enabled and window and "audio_in" in state.card.capabilities else None
        self.covered = 0  # whole windows of the current turn's speech that a prefill was started for
        self.task: asyncio.Task | None = None

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    def heard(self, speech: Callable[[], bytes | None], messages: Callable[[], list[dict[str, Any]]],
              voice: str | None = None) -> None:
        """After an append: ``speech()`` is the pcm16 a commit would take now (None: no speech), ``messages()``
        the conversation before it, ``voice`` the session's when it answers spoken (None: text). Starts
        prefilling when a window more is whole and none runs."""
        if self.window_s is not None and not self.running and self._due(speech()):
            self.task = asyncio.ensure_future(self._loop(speech, messages, body(voice)))

    def _due(self, pcm: bytes | None) -> bool:
        return pcm is not None and int((len(pcm) / 2 / RATE - LOOKAHEAD_S) // self.window_s) > self.covered

    def next_turn(self) -> None:
        """The speech was committed or cleared: the next turn's windows start from none."""
        self.covered = 0

    async def settled(self) -> None:
        """Wait until no prefill runs (it never raises: a cancelled or failed one is simply over)."""
        if self.running:
            await asyncio.wait([self.task])

    async def cancel(self) -> None:
        if self.running:
            self.task.cancel()
            await asyncio.wait([self.task])

    async def _loop(self, speech: Callable[[], bytes | None], messages: Callable[[], list[dict[str, Any]]],
                    request: ChatCompletionRequest) -> None:
        while self._due(pcm := speech()):
            self.covered = int((len(pcm) / 2 / RATE - LOOKAHEAD_S) // self.window_s)
            turn = {"role": "user", "content": [Part("input_audio", pcm=pcm).payload()]}
            await self._run([*messages(), turn], request)

    async def _run(self, messages: list[dict[str, Any]], request: ChatCompletionRequest) -> None:
        try:
            plan = await plan_chat(self.state, request, messages)
            updates = drive_choices(self.state.runner, plan.specs, plan.trackers, ROUTE)
            async with contextlib.aclosing(updates):
                async for _ in updates:
                    pass
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a prefill only saves time; the response computes whatever it did not
            log.debug("realtime prefill while speaking failed: %s", e)
