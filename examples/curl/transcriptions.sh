#!/usr/bin/env bash
# POST /v1/audio/transcriptions and /v1/audio/translations (multipart; models with audio input): json, srt, streamed.
set -euo pipefail
source "$(dirname "$0")/_common.sh"
OUT="${2:-$(mktemp -d)}"
# 0.5 s of a 440 Hz tone as a WAV file (use a real recording with a real model)
python3 -c 'import math, struct, sys, wave
w = wave.open(sys.argv[1], "wb"); w.setnchannels(1); w.setsampwidth(2); w.setframerate(16000)
w.writeframes(b"".join(struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * i / 16000))) for i in range(8000)))' "$OUT/clip.wav"
curl -sS --fail-with-body "${AUTH[@]}" "$BASE/v1/audio/transcriptions" -F file=@"$OUT/clip.wav" -F language=en -F temperature=0
echo
curl -sS --fail-with-body "${AUTH[@]}" "$BASE/v1/audio/transcriptions" -F file=@"$OUT/clip.wav" -F response_format=srt
curl -sS -N --fail-with-body "${AUTH[@]}" "$BASE/v1/audio/transcriptions" -F file=@"$OUT/clip.wav" -F stream=true
curl -sS --fail-with-body "${AUTH[@]}" "$BASE/v1/audio/translations" -F file=@"$OUT/clip.wav" -F response_format=text
echo
