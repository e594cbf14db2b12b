"""The chat prompt behind /v1/audio/transcriptions and /v1/audio/translations.

Qwen3-Omni's model card transcribes with a plain user turn: the audio, then one
instruction ("transcribe this <language> audio into text"), and no system
prompt. The wording here is walkserve's own in that spirit: the language hint
names the audio's language, translation asks for English, and the client's
``prompt`` rides along as context for spelling and style.
"""

from __future__ import annotations

import base64
from typing import Any

from walkserve.api.errors import bad_request

# ISO-639-1 codes of Qwen3-Omni's speech-input languages (Cantonese: "yue", ISO-639-3) -> their English names.
LANGUAGES = {
    "en": "English", "zh": "Chinese", "ko": "Korean", "ja": "Japanese", "de": "German", "ru": "Russian",
    "it": "Italian", "fr": "French", "es": "Spanish", "pt": "Portuguese", "ms": "Malay", "nl": "Dutch",
    "id": "Indonesian", "tr": "Turkish", "vi": "Vietnamese", "yue": "Cantonese", "ar": "Arabic", "ur": "Urdu",
}


def language_name(code: str | None) -> str | None:
    """An ISO-639-1 code (any case) -> its English name; None -> None; an unknown code -> 400 naming ``language``."""
    if code is None or code == "":
        return None
    name = LANGUAGES.get(code.strip().lower())
    if name is None:
        raise bad_request(f"language {code!r} is not one this server knows; use an ISO-639-1 code: "
                          f"{', '.join(sorted(LANGUAGES))}", "language", "unsupported_language")
    return name


def instruction(task: str, language: str | None, context: str | None) -> str:
    """The text that follows the audio in the user turn."""
    spoken = f"{language} audio" if language else "audio"
    if task == "translate":
        text = f"Listen to the {spoken} and translate what is said into English text. Output only the English translation."
    else:
        text = f"Transcribe the {spoken} into text. Output only the transcript."
    if context:
        text += f"\nContext from earlier in the recording, for spelling and style: {context}"
    return text


def transcription_messages(task: str, audio: bytes, audio_format: str, language: str | None,
                           context: str | None) -> list[dict[str, Any]]:
    """The chat messages a client would send to /v1/chat/completions for the same answer."""
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(audio).decode(), "format": audio_format}}
    return [{"role": "user", "content": [part, {"type": "text", "text": instruction(task, language, context)}]}]
