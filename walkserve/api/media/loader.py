"""MediaLoader: URLs and base64 into decoded arrays, off the event loop, under the configured caps."""

from __future__ import annotations

import asyncio

from walkserve.api.config import ServerConfig
from walkserve.api.errors import bad_request
from walkserve.api.media.audio_decode import decode_audio
from walkserve.api.media.data_url import decode_base64
from walkserve.api.media.fetcher import MediaFetcher
from walkserve.api.media.image_codec import decode_image
from walkserve.core.array import ArrayData

FRAME_URL_HEADERS = ("video/jpeg;base64", "video/png;base64")  # a video given as its frames (vLLM's form)
MAX_VIDEO_FRAMES = 768


class MediaLoader:
    def __init__(self, config: ServerConfig):
        self.config = config
        self.fetcher = MediaFetcher(config.media_allowlist, config.max_body_bytes, config.media_fetch_timeout_s)

    def check_count(self, count: int, param: str) -> None:
        if count > self.config.max_media_parts:
            raise bad_request(f"{count} media parts; the limit is {self.config.max_media_parts}", param, "too_many_media_parts")

    async def image_from_url(self, url: str, param: str) -> ArrayData:
        data = await self.fetcher.get(url, param)
        return await self.image_from_bytes(data, param)

    async def image_from_bytes(self, data: bytes, param: str) -> ArrayData:
        return await asyncio.to_thread(decode_image, data, self.config.max_image_pixels, param)

    async def video_from_url(self, url: str, param: str) -> dict:
        """A video file's bytes (``{"video": bytes}``: the model samples and decodes it), or its frames
        (``{"frames": [uint8 [H, W, 3]]}``) for vLLM's ``data:video/jpeg;base64,<frame>,<frame>,...``."""
        if url[:5].lower() == "data:" and url[5:].split(",", 1)[0].lower() in FRAME_URL_HEADERS:
            payloads = url.split(",")[1:]
            self.check_frames(len(payloads), param)
            raws = [decode_base64(p, param) for p in payloads]
            return {"frames": [await self.image_from_bytes(raw, param) for raw in raws]}
        return {"video": await self.fetcher.get(url, param)}

    def check_frames(self, count: int, param: str) -> None:
        if not count:
            raise bad_request("the frames data URL holds no frames", param, "invalid_video")
        if count > MAX_VIDEO_FRAMES:
            raise bad_request(f"{count} video frames; the limit is {MAX_VIDEO_FRAMES}", param, "too_many_frames")

    async def audio_from_base64(self, data: str, param: str) -> tuple[ArrayData, int]:
        raw = decode_base64(data, param)
        return await asyncio.to_thread(decode_audio, raw, self.config.max_audio_seconds, param)

    async def audio_from_url(self, url: str, param: str) -> tuple[ArrayData, int]:
        raw = await self.fetcher.get(url, param)
        return await asyncio.to_thread(decode_audio, raw, self.config.max_audio_seconds, param)
