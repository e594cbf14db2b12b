"""``./dev bench omni --load``: Qwen3-Omni spoken answers as real-time streams under offered load.

The sweep of ``benchmarks/tts_load.py`` (Poisson levels and a burst, capacity
admission with deadline scheduling against count with fifo) on a tiny
random-weight Qwen3-Omni on ``qwen3-omni-split``: each stream a short text turn
(greedy thinker tokens, EOS ignored), then the talker speaks at most ``frames``
frames (80 ms each), streamed as Code2Wav chunks, as a streamed spoken chat
answer is (``RequestSpec.realtime``).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path

from benchmarks.tts_load import Sweep, load_report, sweep_modes

QUICK = Sweep(frames=30, seconds=6.0, loads=(0.5, 1.0, 2.0, 4.0), burst=4.0, frame_samples=1920)
FULL = Sweep(frames=50, seconds=12.0, loads=(0.5, 1.0, 2.0, 4.0), burst=4.0, frame_samples=1920)
TOKENS = 6  # thinker tokens per answer


def run_load(quick: bool, threads: int, modes: str, plot: str, placement: str = "qwen3-omni-split",
             frames: int = 0) -> str:
    """``frames``: frames per stream instead of the sweep's (0: its own). A stream of one 25-frame chunk and a
    short tail plays without a gap far past the sustained capacity (its tail has the first chunk's 2 s to
    come); 100 frames (four chunks) measures what the capacity estimate prices."""
    import walkserve.models.builtin  # noqa: F401
    from benchmarks.omni_speech import prompt
    from walkserve.core.sampling import SamplingParams
    from walkserve.models.base import ModelRef
    from walkserve.models.qwen3_omni.tiny import write_tiny_qwen3_omni
    from walkserve.models.registry import load_model
    from walkserve.placements import path as placement_path

    sweep = QUICK if quick else FULL
    if frames:
        sweep = dataclasses.replace(sweep, frames=frames)
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="walkserve-bench-omni-load-") as tmp:
        path = write_tiny_qwen3_omni(Path(tmp) / "qwen3-omni-load", seed=5, speech=True)
        processor, count = load_model(ModelRef("qwen3-omni", str(path))).processor(), [0]

        def make(n: int, frames: int):
            specs = []
            for _ in range(n):
                count[0] += 1
                payload = {"inputs": {"prompt_token_ids": prompt(processor, count[0])}, "modalities": ["text", "audio"]}
                sampling = SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True)
                spec = processor.build_request("generate", payload, sampling, processor.check_params({"max_audio_frames": frames}))
                spec.audio_rate, spec.realtime = 24000, True
                specs.append(spec)
            return specs

        print(f"omni load sweep on {placement}: {modes} ...", flush=True)
        capacity, levels, _ = sweep_modes(path, str(placement_path(placement)), threads, make, sweep,
                                       tuple(modes.split(",")), family="qwen3-omni")
    model = (f"tiny Qwen3-Omni (write_tiny_qwen3_omni, speech), random weights, {TOKENS} thinker tokens per answer, "
             f"placement {placement}, {threads} torch thread(s) per worker, CPU")
    title = f"./dev bench omni --load{' --quick' if quick else ''}{f' --frames {frames}' if frames else ''} --sweep-modes {modes}"
    return load_report(title, model, sweep, capacity, levels, (load0, os.getloadavg()[0]), plot,
                       f"tiny Qwen3-Omni, {placement}, capacity {capacity}")
