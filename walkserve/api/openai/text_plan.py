"""TextPlan: the requests and choice trackers of one chat or completions call."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from walkserve.api.audio.formats import AudioFormat
from walkserve.api.openai.choices import ChoiceTracker
from walkserve.core.request import RequestSpec


@dataclass
class AudioOut:
    """Spoken output of a chat call: voice, encoding, and one audio id per choice."""

    voice: str | None
    format: AudioFormat
    ids: list[str]


@dataclass
class TextPlan:
    model: str
    specs: list[RequestSpec]
    trackers: list[ChoiceTracker]
    include_usage: bool = False
    audio: AudioOut | None = None
    prefixes: list[str] = field(default_factory=list)  # completions' echo: text before each choice
    shows: Callable[[int], bool] = lambda token_id: True  # completions' text_offset: is a token's text in the text?
    id: str = field(default_factory=lambda: secrets.token_hex(12))
    created: int = field(default_factory=lambda: int(time.time()))
