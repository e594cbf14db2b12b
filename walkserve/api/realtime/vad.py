"""Server VAD: the WebRTC voice-activity detector (``webrtcvad``, a GMM over sub-band energies, C, no model file
to fetch) on 20 ms frames, behind an energy gate, with a start rule and a silence hangover.

    pcm16 24 kHz ──► 8 kHz (mean of 3: a box low-pass, then decimation) ──► 20 ms frames
    voiced frame:  webrtcvad says speech AND the frame's level is above the gate
    speech starts: 3 of the last 5 frames voiced; it starts at the first voiced one of them
    speech stops:  ``silence_duration_ms`` of unvoiced frames in a row (the hangover), at the end of the last one

The gate matters: webrtcvad calls the first frames of quiet noise speech while it adapts, and keeps saying
speech for a while after it ends (its own hangover); a frame below the gate is never speech, so silence ends a
turn after ``silence_duration_ms`` and room noise does not start one. ``threshold`` (0..1, the Realtime
API's) sets both: the gate from -60 dBFS (0) to -30 dBFS (1), -45 at the default 0.5, and the detector's
aggressiveness, 0..3. Positions are sample indices at 24 kHz since the session began.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import webrtcvad

from walkserve.api.realtime.session_config import RATE, TurnDetection

DECIMATE = 3  # 24 kHz -> 8 kHz, a rate webrtcvad takes
FRAME = RATE // 50  # 20 ms at 24 kHz: 480 samples
START_WINDOW, START_VOICED = 5, 3


class ServerVad:
    def __init__(self, settings: TurnDetection, position: int = 0):
        self.settings = settings
        self._vad = webrtcvad.Vad(min(3, int(settings.threshold * 4)))
        self._gate = 32768.0 * 10 ** ((-60 + 30 * settings.threshold) / 20)  # RMS, in pcm16 units
        self._rest = np.zeros(0, np.int16)
        self._window: deque[bool] = deque(maxlen=START_WINDOW)
        self._silent = 0  # unvoiced frames in a row while speaking
        self.position = position  # samples seen (24 kHz) since the session began
        self.speaking = False

    def push(self, pcm: bytes) -> list[tuple[str, int]]:
        """Appended audio -> ``("speech_started" | "speech_stopped", sample position)`` in order."""
        samples = np.concatenate([self._rest, np.frombuffer(pcm, "<i2")])
        whole = len(samples) // FRAME * FRAME
        self._rest = samples[whole:].copy()
        out = []
        for start in range(0, whole, FRAME):
            voiced = self._voiced(samples[start:start + FRAME])
            self.position += FRAME
            change = self._step(voiced)
            if change:
                out.append(change)
        return out

    def _voiced(self, frame: np.ndarray) -> bool:
        if np.sqrt(np.mean(frame.astype(np.float64) ** 2)) < self._gate:
            return False
        low = frame.reshape(-1, DECIMATE).astype(np.int32).mean(axis=1).astype("<i2")  # [160] at 8 kHz
        return self._vad.is_speech(low.tobytes(), RATE // DECIMATE)

    def _step(self, voiced: bool) -> tuple[str, int] | None:
        self._window.append(voiced)
        if not self.speaking:
            if sum(self._window) < START_VOICED:
                return None
            self.speaking, self._silent = True, 0
            first = list(self._window).index(True)
            return "speech_started", self.position - (len(self._window) - first) * FRAME
        self._silent = 0 if voiced else self._silent + 1
        if self._silent * 20 < self.settings.silence_duration_ms:
            return None
        self.speaking = False
        self._window.clear()
        return "speech_stopped", self.position
