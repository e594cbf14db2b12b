"""Spoken chat answers (audio_out models): python examples/openai_client/chat_audio.py [BASE_URL] [OUT.wav]."""

import base64
import sys

from _base import client, served_model

api = client()
model = served_model(api)
messages = [{"role": "user", "content": "Greet me."}]
answer = api.chat.completions.create(model=model, messages=messages, modalities=["text", "audio"], audio={"format": "wav"}, max_tokens=32)
audio = answer.choices[0].message.audio
out = sys.argv[2] if len(sys.argv) > 2 else "chat_answer.wav"
with open(out, "wb") as f:
    f.write(base64.b64decode(audio.data))
print("transcript:", audio.transcript, "| wrote", out)
pcm = bytearray()
stream = api.chat.completions.create(
    model=model, messages=messages, modalities=["text", "audio"], audio={"format": "pcm16"}, max_tokens=32, stream=True
)
for chunk in stream:
    delta = (chunk.choices[0].delta.model_extra or {}).get("audio") if chunk.choices else None
    if delta and delta.get("data"):
        pcm += base64.b64decode(delta["data"])
print("streamed", len(pcm) // 2, "pcm16 samples")
