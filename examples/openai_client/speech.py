"""Text to speech in every available format, then streamed: python examples/openai_client/speech.py [BASE_URL] [OUT_DIR]."""

import sys
from pathlib import Path

from _base import client, served_model

api = client()
model = served_model(api)
card = api.models.retrieve(model).model_extra or {}
out = Path(sys.argv[2] if len(sys.argv) > 2 else ".")
voice = card.get("default_voice") or "alloy"
for fmt in card.get("audio_formats", ["wav"]):
    audio = api.audio.speech.create(model=model, voice=voice, input="Hello from walkserve.", response_format=fmt)
    path = out / f"speech.{fmt}"
    path.write_bytes(audio.content)
    print(f"{fmt}: {len(audio.content)} bytes -> {path}")
with api.audio.speech.with_streaming_response.create(model=model, voice=voice, input="Streaming speech.", response_format="pcm") as response:
    size = sum(len(chunk) for chunk in response.iter_bytes())
print("streamed pcm:", size, "bytes")
