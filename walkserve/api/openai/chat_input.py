"""Chat messages -> the processor's payload: content parts with decoded media, under the caps."""

from __future__ import annotations

from typing import Any

from walkserve.api.schemas.chat import AudioPart, ChatMessage, ImagePart, VideoPart
from walkserve.api.state import AppState


def count_media(messages: list[ChatMessage]) -> int:
    return sum(
        isinstance(part, (ImagePart, AudioPart, VideoPart))
        for message in messages
        if isinstance(message.content, list)
        for part in message.content
    )


async def _part(state: AppState, part: Any, param: str) -> dict[str, Any]:
    if isinstance(part, ImagePart):
        state.require("image_in", "image inputs", param)
        return {"type": "image", "image": await state.media.image_from_url(part.image_url.url, f"{param}.image_url.url")}
    if isinstance(part, AudioPart):
        state.require("audio_in", "audio inputs", param)
        audio, rate = await state.media.audio_from_base64(part.input_audio.data, f"{param}.input_audio.data")
        return {"type": "audio", "audio": audio, "sample_rate": rate, "format": part.input_audio.format}
    if isinstance(part, VideoPart):
        state.require("video_in", "video inputs", param)
        video = await state.media.video_from_url(part.video_url.url, f"{param}.video_url.url")
        return {"type": "video", **video, "fps": part.video_url.fps}
    return {"type": "text", "text": part.text}


async def convert_messages(state: AppState, messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Each message as ``{"role", "content": [parts], "name"?}``; text-only content becomes one text part."""
    state.media.check_count(count_media(messages), "messages")
    out = []
    for i, message in enumerate(messages):
        if message.content is None:
            parts = []
        elif isinstance(message.content, str):
            parts = [{"type": "text", "text": message.content}]
        else:
            parts = [await _part(state, p, f"messages[{i}].content[{j}]") for j, p in enumerate(message.content)]
        # "developer" is OpenAI's newer name for the system prompt; chat templates know only "system"
        role = "system" if message.role == "developer" else message.role
        converted: dict[str, Any] = {"role": role, "content": parts}
        if message.name:
            converted["name"] = message.name
        out.append(converted)
    return out
