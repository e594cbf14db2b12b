"""Stream speech as raw PCM through walkserve.client: python examples/sdk/speech_stream.py [BASE_URL] [OUT.wav]."""

import sys

import numpy as np
import soundfile as sf

from walkserve.client import Client

base = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"
out = sys.argv[2] if len(sys.argv) > 2 else "streamed.wav"
with Client(base) as client:
    rate = client.models()[0]["sample_rate"] or 24000
    pcm = bytearray()
    for chunk in client.speech_stream("Audio arrives while it is being generated.", response_format="pcm"):
        pcm += chunk
        print(f"\r{len(pcm) // 2} samples", end="", flush=True)
    sf.write(out, np.frombuffer(bytes(pcm), dtype="<i2"), rate)
    print("\nwrote", out)
