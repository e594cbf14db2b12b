"""A transcript in OpenAI's response formats: json, text, verbose_json, srt, vtt.

The model gives no timestamps, so verbose_json, srt and vtt carry one segment
(one cue) that spans the whole audio.
"""

from __future__ import annotations

import zlib
from typing import Any

from walkserve.api.openai.transcriptions import TranscriptionPlan, transcription_usage

MEDIA_TYPES = {"json": "application/json", "verbose_json": "application/json", "text": "text/plain; charset=utf-8",
               "srt": "text/plain; charset=utf-8", "vtt": "text/vtt; charset=utf-8"}


def timestamp(seconds: float, decimal: str) -> str:
    """HH:MM:SS,mmm (SubRip, ``decimal=","``) or HH:MM:SS.mmm (WebVTT)."""
    ms = max(0, round(seconds * 1000))
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal}{ms:03d}"


def cue_text(text: str) -> str:
    """Cue text that cannot end its cue early: no blank lines, no ``-->``."""
    lines = [line.strip() for line in text.strip().replace("-->", "->").splitlines()]
    return "\n".join(line for line in lines if line)


def srt(text: str, duration: float) -> str:
    return f"1\n{timestamp(0, ',')} --> {timestamp(duration, ',')}\n{cue_text(text)}\n\n"


def vtt(text: str, duration: float) -> str:
    return f"WEBVTT\n\n{timestamp(0, '.')} --> {timestamp(duration, '.')}\n{cue_text(text)}\n\n"


def compression_ratio(text: str) -> float:
    raw = text.encode()
    return len(raw) / len(zlib.compress(raw)) if raw else 0.0


def verbose(plan: TranscriptionPlan, text: str) -> dict[str, Any]:
    """OpenAI's verbose_json; ``language`` is the hint's name, lower case as OpenAI writes it ("unknown" without one)."""
    segment = {"id": 0, "seek": 0, "start": 0.0, "end": round(plan.duration, 3), "text": text,
               "temperature": plan.form.temperature, "compression_ratio": compression_ratio(text)}
    return {"task": plan.form.task,
            "language": (plan.language or "unknown").lower(), "duration": round(plan.duration, 3), "text": text,
            "segments": [segment], "usage": {"type": "duration", "seconds": round(plan.duration, 3)}}


def render(plan: TranscriptionPlan, text: str) -> str | dict[str, Any]:
    """The response body: a JSON object (json, verbose_json) or text (text, srt, vtt)."""
    fmt = plan.form.response_format
    if fmt == "json":
        return {"text": text, "usage": transcription_usage(plan)}
    if fmt == "verbose_json":
        return verbose(plan, text)
    if fmt == "srt":
        return srt(text, plan.duration)
    if fmt == "vtt":
        return vtt(text, plan.duration)
    return text
