"""Speech to text (audio_in models): python examples/openai_client/transcriptions.py [BASE_URL] [OUT_DIR].

Writes a short WAV tone, then transcribes it in every response format, streamed, and translated to English.
"""

import io
import math
import struct
import wave

from _base import client, served_model

rate = 16000
buffer = io.BytesIO()
with wave.open(buffer, "wb") as w:  # 0.5 s of a 440 Hz tone (use a real recording with a real model)
    w.setnchannels(1), w.setsampwidth(2), w.setframerate(rate)
    w.writeframes(b"".join(struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * i / rate))) for i in range(rate // 2)))
clip = ("clip.wav", buffer.getvalue())

api = client()
model = served_model(api)
result = api.audio.transcriptions.create(file=clip, model=model, language="en", prompt="walkserve", temperature=0)
print("json:", result.text)
for fmt in ("text", "srt", "vtt"):
    print(f"{fmt}:", api.audio.transcriptions.create(file=clip, model=model, response_format=fmt))
verbose = api.audio.transcriptions.create(file=clip, model=model, response_format="verbose_json")
print("verbose_json: duration", verbose.duration, "segments", [(s.start, s.end) for s in verbose.segments])
for event in api.audio.transcriptions.create(file=clip, model=model, stream=True):
    print(event.type, event.delta if event.type == "transcript.text.delta" else event.text)
print("translation:", api.audio.translations.create(file=clip, model=model).text)
