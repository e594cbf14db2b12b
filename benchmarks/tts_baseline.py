"""The naive baseline: the same checkpoint served one request at a time by transformers + the snac package.

Per request: ``LlamaForCausalLM.generate`` (same prompt ids, same sampling, the
same audio-position constraint as walkserve) with a streamer that decodes SNAC
windows inline, the way the official Orpheus streaming decoder does: once 28
tokens exist and then every 7, decode the last 28 tokens (4 frames) and emit
one frame; generation waits while the window decodes. The emitted frames
follow walkserve's rule (the first window also emits frame 0; at the end the
last window is decoded again for its last two frames), so both produce the
same audio length. transformers and snac are imported here only.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from benchmarks.tts_trace import StreamTrace
from walkserve.core.request import RequestSpec
from walkserve.models.orpheus.emission import request_seed

FRAME, WINDOW, FRAME_SAMPLES = 7, 28, 2048


class WindowStreamer:
    """A ``generate`` streamer: collects audio tokens and SNAC-decodes each window as soon as it is complete."""

    def __init__(self, snac_model, stop_ids: tuple[int, ...], base_seed: int, trace: StreamTrace, t0: float):
        self.snac, self.stop_ids, self.seed, self.trace, self.t0 = snac_model, stop_ids, base_seed, trace, t0
        self.tokens: list[int] = []
        self.prompt_seen = False
        self.windows = 0

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:  # generate passes the prompt first
            self.prompt_seen = True
            return
        token = int(value.reshape(-1)[-1])
        if token in self.stop_ids:
            return
        self.tokens.append(token)
        n = len(self.tokens)
        if n == WINDOW:
            self.trace.extra["t_window_tokens_s"] = time.perf_counter() - self.t0
        if n >= WINDOW and (n - WINDOW) % FRAME == 0:
            first = n // FRAME - WINDOW // FRAME
            start = time.perf_counter()
            wave = self._decode(first, n)
            if first == 0:
                self.trace.extra["t_first_window_decode_s"] = time.perf_counter() - start
            self._emit(wave[: 2 * FRAME_SAMPLES] if first == 0 else wave[FRAME_SAMPLES : 2 * FRAME_SAMPLES])
            self.windows += 1

    def end(self) -> None:
        if self.windows:
            first = self.windows - 1
            self._emit(self._decode(first, FRAME * first + WINDOW)[2 * FRAME_SAMPLES :])
        elif len(self.tokens) >= FRAME:
            self._emit(self._decode(0, FRAME * (len(self.tokens) // FRAME)))
        self.trace.finished_s = time.perf_counter() - self.t0

    def _decode(self, first_frame: int, end: int) -> torch.Tensor:
        from walkserve.testing.orpheus_offline import decode_window

        return decode_window(self.snac, self.tokens[FRAME * first_frame : end], first_frame, self.seed)

    def _emit(self, wave: torch.Tensor) -> None:
        self.trace.add(time.perf_counter() - self.t0, wave.numel())


class _OnDevice:
    """The snac model on a GPU behind the CPU interface ``decode_window`` uses (codes in, audio back on the CPU)."""

    def __init__(self, snac_model, device: torch.device):
        self.model, self.device = snac_model, device

    def decode(self, codes: list[torch.Tensor]) -> torch.Tensor:
        return self.model.decode([c.to(self.device) for c in codes]).float().cpu()


class Baseline:
    """transformers LM + snac decoder in this process; ``speak`` runs one request and returns its trace."""

    def __init__(self, model_dir: Path, threads: int, device: str = "cpu"):
        from walkserve.testing.orpheus_offline import load_lm, load_snac

        torch.set_num_threads(threads)
        self.device = torch.device(device)
        self.lm = load_lm(model_dir / "lm").to(self.device)
        if self.device.type == "cuda":
            self.lm = self.lm.to(torch.bfloat16)  # as walkserve serves it there
        snac = load_snac(model_dir / "snac").to(self.device)
        self.snac = snac if self.device.type == "cpu" else _OnDevice(snac, self.device)

    @torch.inference_mode()
    def speak(self, spec: RequestSpec) -> StreamTrace:
        from transformers import LogitsProcessorList

        from walkserve.testing.orpheus_offline import AudioPositionMask

        s = spec.sampling
        prompt = spec.inputs["prompt_token_ids"].tolist()
        trace = StreamTrace(spec.id)
        t0 = time.perf_counter()
        streamer = WindowStreamer(self.snac, tuple(s.stop_token_ids), request_seed(spec.id, s.seed), trace, t0)
        if s.seed is not None:
            torch.manual_seed(s.seed)
        sampled = {"do_sample": True, "temperature": s.temperature, "top_p": s.top_p} if s.temperature > 0 else {}
        out = self.lm.generate(
            torch.tensor([prompt], device=self.device),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=self.device),
            max_new_tokens=s.max_tokens,
            eos_token_id=list(s.stop_token_ids),
            pad_token_id=0,
            repetition_penalty=s.repetition_penalty,
            logits_processor=LogitsProcessorList([AudioPositionMask(len(prompt))]),
            streamer=streamer,
            **({"do_sample": False} | sampled),
        )
        trace.reason = "stop" if int(out[0, -1]) in s.stop_token_ids else "length"
        return trace
