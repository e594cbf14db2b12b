"""POST /v1/chat/completions."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from walkserve.api.schemas.common import (
    ApiModel,
    Count,
    Flag,
    SamplingFields,
    StreamOptions,
    model_field,
)


class TextPart(ApiModel):
    type: Literal["text"]
    text: str


class ImageUrl(ApiModel):
    url: str = Field(description="A data: URL (base64), or an http(s) URL on the server's media allowlist.")
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(ApiModel):
    type: Literal["image_url"]
    image_url: ImageUrl


class InputAudio(ApiModel):
    data: str = Field(description="Base64 audio bytes.")
    format: str = Field("wav", max_length=16, description="wav, mp3, flac, ogg ...")


class AudioPart(ApiModel):
    type: Literal["input_audio"]
    input_audio: InputAudio


class VideoUrl(ApiModel):
    url: str = Field(description="A data: URL of a video file (mp4, webm, ...) or of frames (vLLM's "
                     "data:video/jpeg;base64,<frame>,<frame>,...), or an http(s) URL on the server's media allowlist.")
    fps: Annotated[float, Field(gt=0, le=240)] | None = Field(
        None, description="Frames given as frames: their rate (default: the model's sampling rate, 2 for Qwen3-Omni).")


class VideoPart(ApiModel):
    type: Literal["video_url"]
    video_url: VideoUrl


ContentPart = Annotated[TextPart | ImagePart | AudioPart | VideoPart, Field(discriminator="type")]


class ChatMessage(ApiModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | Annotated[list[ContentPart], Field(max_length=256)] | None = None
    name: str | None = None


class ChatAudio(ApiModel):
    voice: str | None = Field(None, max_length=128)
    format: str = Field("wav", max_length=16, description="wav, mp3, flac, opus, pcm16, aac (what is installed)")
    max_frames: Annotated[int, Field(strict=True, ge=1, le=65536)] | None = Field(
        None, description="walkserve extension: at most this many codec frames of speech (Qwen3-Omni: 12.5 per s).")
    node_sampling: dict[str, dict[str, Any]] | None = Field(
        None, description="walkserve extension: sampling per node of the speech path, e.g. "
                          '{"talker": {"temperature": 0.7}, "code_predictor": {"top_k": 20}, "thinker": {...}}.')


class ChatCompletionRequest(SamplingFields):
    model: str | None = model_field()
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=4096)]
    max_completion_tokens: Count | None = None
    modalities: Annotated[list[Literal["text", "audio"]], Field(min_length=1, max_length=2)] | None = None
    audio: ChatAudio | None = None
    think: bool | None = None  # extension: a model's think mode (BAGEL), passed to its parameters when set
    stream: Flag = False
    stream_options: StreamOptions | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(strict=True, ge=0, le=20)] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None
    user: str | None = None
