"""SessionConfig: what ``session.update`` sets, checked field by field, and the ``session`` object sent back.

Audio is pcm16 mono at 24 kHz both ways (``{"type": "audio/pcm", "rate": 24000}``); other formats are refused.
Sampling rides in the session object as a walkserve extension the GA schema lacks (the ``openai`` client passes
unknown keys through): ``temperature`` (0 = greedy), ``top_p``, ``seed``; so does ``audio.output.max_frames``, the
chat route's ``audio.max_frames`` (at most this many codec frames of each spoken answer). Fields the model cannot honour
(``tools``, ``semantic_vad``, a ``prompt``) are refused with an error event; fields that only tune the reference
service (``tracing``, ``truncation``, ``include``, ``noise_reduction``, ``speed``) are ignored. Input
``transcription`` (``{model, language, prompt}`` or null) turns on the transcription of committed user audio by the
served model itself (``input_transcription.py``); its ``model`` is echoed back, whatever it names.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from walkserve.api.errors import ApiError
from walkserve.api.openai.transcription_prompt import language_name
from walkserve.api.realtime.events import invalid, new_id

RATE = 24000
PCM = {"type": "audio/pcm", "rate": RATE}
MODALITIES = (["text"], ["audio"], ["text", "audio"], ["audio", "text"])
MAX_OUTPUT_TOKENS = 1 << 20
MAX_FRAMES = 65536  # as the chat route's audio.max_frames


@dataclass(frozen=True)
class TurnDetection:
    """Server VAD's settings (the reference's defaults)."""

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True

    def describe(self) -> dict[str, Any]:
        return {"type": "server_vad", **dataclasses.asdict(self), "idle_timeout_ms": None}


@dataclass(frozen=True)
class InputTranscription:
    """``audio.input.transcription``: transcribe each committed user turn (``language``: an ISO-639-1 hint)."""

    model: str | None = None
    language: str | None = None
    prompt: str | None = None

    def describe(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class SessionConfig:
    model: str
    voice: str | None
    output_modalities: list[str]
    instructions: str = ""
    turn_detection: TurnDetection | None = field(default_factory=TurnDetection)
    transcription: InputTranscription | None = None
    max_output_tokens: int | None = None  # None: "inf" (the room left in the context, or the card's default)
    temperature: float | None = None  # None: the model card's default
    top_p: float | None = None
    seed: int | None = None
    max_audio_frames: int | None = None  # None: the model's bound (the chat route's audio.max_frames unset)
    id: str = field(default_factory=lambda: new_id("sess"))

    @property
    def speaks(self) -> bool:
        return "audio" in self.output_modalities

    def describe(self) -> dict[str, Any]:
        detection = self.turn_detection.describe() if self.turn_detection else None
        return {
            "type": "realtime", "object": "realtime.session", "id": self.id, "model": self.model,
            "output_modalities": self.output_modalities, "instructions": self.instructions,
            "audio": {"input": {"format": PCM, "turn_detection": detection, "noise_reduction": None,
                                "transcription": self.transcription.describe() if self.transcription else None},
                      "output": {"format": PCM, "voice": self.voice, "speed": 1.0,
                                 "max_frames": self.max_audio_frames}},
            "max_output_tokens": self.max_output_tokens or "inf", "tools": [], "tool_choice": "auto",
            "temperature": self.temperature, "top_p": self.top_p, "seed": self.seed,
        }


def apply_update(config: SessionConfig, session: Any, check_voice, where: str = "session") -> SessionConfig:
    """A new config with ``session``'s fields applied; ApiError naming the field for anything wrong (nothing
    is applied then). ``check_voice(name, param)`` returns the card's spelling of a voice or raises.
    ``where`` is ``response`` for a ``response.create``'s overrides (the same fields, for one response)."""
    if not isinstance(session, dict):
        raise invalid(f"{where} must be an object", where)
    if where == "session" and session.get("type", "realtime") != "realtime":
        raise invalid("only realtime sessions are served here (not transcription sessions)", "session.type")
    for name in ("tools", "prompt", "input"):
        if session.get(name):
            raise ApiError(400, f"{where}.{name} is not supported by this server", f"{where}.{name}", "unsupported_parameter")
    new = dataclasses.replace(config)
    if "instructions" in session:
        new.instructions = _text(session["instructions"], f"{where}.instructions")
    if "output_modalities" in session:
        new.output_modalities = modalities(session["output_modalities"], f"{where}.output_modalities")
    _sampling(new, session, where)
    audio = session.get("audio") or {}
    if not isinstance(audio, dict):
        raise invalid(f"{where}.audio must be an object", f"{where}.audio")
    audio_in, audio_out = audio.get("input") or {}, audio.get("output") or {}
    for side, value in (("input", audio_in), ("output", audio_out)):
        if not isinstance(value, dict):
            raise invalid(f"{where}.audio.{side} must be an object", f"{where}.audio.{side}")
    check_format(audio_in.get("format"), f"{where}.audio.input.format")
    check_format(audio_out.get("format"), f"{where}.audio.output.format")
    if "voice" in audio_out:
        param = f"{where}.audio.output.voice"
        new.voice = check_voice(voice_name(audio_out["voice"], param), param)
    if "max_frames" in audio_out:
        new.max_audio_frames = max_frames(audio_out["max_frames"], f"{where}.audio.output.max_frames")
    if "turn_detection" in audio_in:
        new.turn_detection = turn_detection(audio_in["turn_detection"])
    if "transcription" in audio_in and where == "session":
        new.transcription = input_transcription(audio_in["transcription"])
    return new


def _sampling(new: SessionConfig, session: dict[str, Any], where: str) -> None:
    if "max_output_tokens" in session:
        new.max_output_tokens = max_output_tokens(session["max_output_tokens"], f"{where}.max_output_tokens")
    if "temperature" in session:
        new.temperature = _number(session["temperature"], f"{where}.temperature", 0.0, 100.0)
    if "top_p" in session:
        value = _number(session["top_p"], f"{where}.top_p", 0.0, 1.0)
        if value is not None and value <= 0:
            raise invalid(f"{where}.top_p must be in (0, 1]", f"{where}.top_p")
        new.top_p = value
    if "seed" in session:
        seed = session["seed"]
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
            raise invalid(f"{where}.seed must be an integer in [0, 2**63)", f"{where}.seed")
        new.seed = seed


def modalities(value: Any, param: str) -> list[str]:
    if not isinstance(value, list) or value not in MODALITIES:
        raise invalid('output_modalities must be ["audio"] (speech and its transcript) or ["text"]', param)
    return ["audio"] if "audio" in value else ["text"]


def max_output_tokens(value: Any, param: str) -> int | None:
    if value is None or value == "inf":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_OUTPUT_TOKENS:
        raise invalid(f'{param} must be an integer in [1, {MAX_OUTPUT_TOKENS}] or "inf"', param)
    return value


def max_frames(value: Any, param: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_FRAMES:
        raise invalid(f"{param} must be an integer in [1, {MAX_FRAMES}] or null", param)
    return value


def voice_name(value: Any, param: str) -> str | None:
    name = value.get("id") if isinstance(value, dict) else value
    if name is not None and not isinstance(name, str):
        raise invalid(f"{param} must be a voice name (or an object with its id)", param)
    return name


def check_format(value: Any, param: str) -> None:
    if value is None:
        return
    kind = value.get("type") if isinstance(value, dict) else None
    rate = value.get("rate", RATE) if isinstance(value, dict) else None
    if kind != "audio/pcm" or rate != RATE:
        raise ApiError(400, f"{param}: this server takes and sends pcm16 at 24 kHz only "
                       '({"type": "audio/pcm", "rate": 24000})', param, "unsupported_format")


def turn_detection(value: Any) -> TurnDetection | None:
    param = "session.audio.input.turn_detection"
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") != "server_vad":
        raise ApiError(400, 'turn_detection must be null or {"type": "server_vad", ...} (no semantic_vad here)', param,
                       "unsupported_parameter")
    base = TurnDetection()
    values = {
        "threshold": _number(value.get("threshold", base.threshold), f"{param}.threshold", 0.0, 1.0),
        "prefix_padding_ms": _ms(value.get("prefix_padding_ms", base.prefix_padding_ms), f"{param}.prefix_padding_ms"),
        "silence_duration_ms": _ms(value.get("silence_duration_ms", base.silence_duration_ms), f"{param}.silence_duration_ms"),
        "create_response": bool(value.get("create_response", base.create_response)),
        "interrupt_response": bool(value.get("interrupt_response", base.interrupt_response)),
    }
    return TurnDetection(**{k: (getattr(base, k) if v is None else v) for k, v in values.items()})


def input_transcription(value: Any) -> InputTranscription | None:
    param = "session.audio.input.transcription"
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid(f"{param} must be null or an object {{model, language, prompt}}", param)
    fields = {}
    for name in ("model", "language", "prompt"):
        text = value.get(name)
        if text is not None and not isinstance(text, str):
            raise invalid(f"{param}.{name} must be a string", f"{param}.{name}")
        fields[name] = text or None
    try:
        language_name(fields["language"])
    except ApiError as e:
        raise ApiError(400, e.message, f"{param}.language", e.code) from None
    return InputTranscription(**fields)


def _text(value: Any, param: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise invalid(f"{param} must be a string", param)
    return value


def _number(value: Any, param: str, low: float, high: float) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise invalid(f"{param} must be a number in [{low:g}, {high:g}]", param)
    return float(value)


def _ms(value: Any, param: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 10_000:
        raise invalid(f"{param} must be an integer number of milliseconds in [0, 10000]", param)
    return value
