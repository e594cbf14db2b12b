"""Media inputs reach the processor decoded; remote URLs only from the allowlist."""

from __future__ import annotations

import base64
import io
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from walkserve.testing.fake_engine import FakeEngine, FakeEngineConfig
from walkserve.testing.fake_processor import FakeProcessor

from .helpers import asgi_client, assert_envelope

PIXELS = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)


def png_bytes() -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(PIXELS).save(buffer, format="PNG")
    return buffer.getvalue()


class RecordingProcessor(FakeProcessor):
    def __init__(self, card):
        super().__init__(card)
        self.payloads: list[dict] = []

    def build_request(self, task, payload, sampling, params):
        self.payloads.append(payload)
        return super().build_request(task, payload, sampling, params)


def recording_engine() -> tuple[FakeEngine, RecordingProcessor]:
    engine = FakeEngine(FakeEngineConfig(token_delay_s=0.0))
    processor = RecordingProcessor(engine.config.card())
    engine._processor = processor
    return engine, processor


def chat_with(*parts: dict) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": "look"}, *parts]}], "max_tokens": 2}


async def test_data_url_image_and_audio_reach_the_processor() -> None:
    engine, processor = recording_engine()
    wav = io.BytesIO()
    tone = (0.25 * np.sin(np.arange(8000) * 0.1)).astype(np.float32)
    sf.write(wav, np.stack([tone, tone], axis=1), 8000, format="WAV", subtype="FLOAT")
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png_bytes()).decode()}}
    audio = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav.getvalue()).decode(), "format": "wav"}}
    async with asgi_client(engine) as client:
        assert (await client.post("/v1/chat/completions", json=chat_with(image, audio))).status_code == 200
    parts = processor.payloads[-1]["messages"][0]["content"]
    assert [p["type"] for p in parts] == ["text", "image", "audio"]
    got = parts[1]["image"]
    assert got.dtype == "uint8" and got.shape == (4, 6, 3)
    assert np.array_equal(np.frombuffer(got.data, np.uint8).reshape(4, 6, 3), PIXELS)
    samples = np.frombuffer(parts[2]["audio"].data, np.float32)
    assert parts[2]["sample_rate"] == 8000 and np.allclose(samples, tone, atol=1e-6)  # stereo mixed to mono


async def test_base64_wrapped_in_lines_reads_as_the_same_image() -> None:
    """MIME base64 (``base64 file`` on the command line) breaks its lines every 76 characters."""
    engine, processor = recording_engine()
    text = base64.encodebytes(png_bytes()).decode()  # 76-character lines, each ending in a newline
    assert "\n" in text.strip()
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + text.replace("\n", "\r\n")}}
    async with asgi_client(engine) as client:
        assert (await client.post("/v1/chat/completions", json=chat_with(image))).status_code == 200
    got = processor.payloads[-1]["messages"][0]["content"][1]["image"]
    assert np.array_equal(np.frombuffer(got.data, np.uint8).reshape(4, 6, 3), PIXELS)


async def test_an_image_is_read_upright_by_its_exif_orientation() -> None:
    """A phone's portrait photo is stored sideways with an EXIF orientation tag (6: turn 90 degrees clockwise to
    view); the model gets it as every viewer shows it, not on its side."""
    engine, processor = recording_engine()
    exif = Image.Exif()
    exif[0x0112] = 6
    buffer = io.BytesIO()
    Image.fromarray(PIXELS).save(buffer, format="PNG", exif=exif)
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()}}
    async with asgi_client(engine) as client:
        assert (await client.post("/v1/chat/completions", json=chat_with(image))).status_code == 200
    got = processor.payloads[-1]["messages"][0]["content"][1]["image"]
    assert got.shape == (6, 4, 3)
    assert np.array_equal(np.frombuffer(got.data, np.uint8).reshape(6, 4, 3), np.rot90(PIXELS, k=-1))


class MediaHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/media/cat.png":
            body = png_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_response(302)
            self.send_header("Location", "http://169.254.169.254/")
            self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def media_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), MediaHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


async def test_allowlisted_urls_only(media_server: str) -> None:
    engine, processor = recording_engine()
    def image(url: str) -> dict:
        return {"type": "image_url", "image_url": {"url": url}}

    async with asgi_client(engine, media_allowlist=(f"{media_server}/media/",)) as client:
        assert (await client.post("/v1/chat/completions", json=chat_with(image(f"{media_server}/media/cat.png")))).status_code == 200
        got = processor.payloads[-1]["messages"][0]["content"][1]["image"]
        assert np.array_equal(np.frombuffer(got.data, np.uint8).reshape(4, 6, 3), PIXELS)
        for url in (f"{media_server}/other/cat.png", f"{media_server}/media/../other", "http://user@127.0.0.1/media/x",
                    media_server.replace("127.0.0.1", "localhost") + "/media/cat.png"):
            response = await client.post("/v1/chat/completions", json=chat_with(image(url)))
            assert_envelope(response, 400, code="url_not_allowed")
        redirect = await client.post("/v1/chat/completions", json=chat_with(image(f"{media_server}/media/redirect")))
        assert_envelope(redirect, 400, code="fetch_failed")
    async with asgi_client(engine) as client:
        response = await client.post("/v1/chat/completions", json=chat_with(image(f"{media_server}/media/cat.png")))
        assert_envelope(response, 400, code="url_not_allowed")
