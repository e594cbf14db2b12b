"""``./dev bench omni``: Qwen3-Omni spoken answers (thinker -> talker -> Code2Wav), side by side in one run.

    (ref)  transformers Qwen3OmniMoeForConditionalGeneration.generate(return_audio=True), one request at a time,
           first and (outside --quick) again after the placements; ratios are to the faster of the two
    (1)    walkserve, placement qwen3-omni (one rank), at concurrency 1 / 4 / 16
    (2)    walkserve, placement qwen3-omni-split (talker + Code2Wav on their own rank), the same

Each request: a short text turn, ``tokens`` thinker tokens (greedy, EOS ignored), then the talker speaks
(greedy on both sides, no repetition penalty, so both make the same frames; at most ``frames`` frames,
or fewer when the talker emits codec EOS). transformers' talker never reads the thinker's last token
(walkserve speaks it), so the reference runs ``tokens + 1`` thinker tokens, as the tests do, and speaks
the same ``tokens``; the check compares all 16 codes of every frame of the first answers of each level.
The model is a random-weight Qwen3-Omni with the release's
structure (the tiny writer's talker, code predictor and Code2Wav; a larger thinker outside --quick).
Figures: audio seconds per wall second, and per CPU second of our processes; TTFA (submission to the first audio); the arrival of the 25th
frame (Code2Wav's first chunk needs 25); RTF = a request's wall time / its audio seconds (p50, p95);
deadline misses = audio chunks that arrive after the audio before them has played out (playback starting
at the first chunk); and each placement's busy seconds per partition (thinker; talker = talker, code
predictor and the per-frame glue nodes; codec = Code2Wav). transformers decodes the waveform only
after the talker ends, so its TTFA is its whole latency. Targets: >= 3x (ref)'s audio seconds per
wall second at concurrency 16; TTFA at concurrency 1 <= the 25th frame's arrival + one chunk decode.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.common import conditions, mean, pct, table
from benchmarks.cpu_time import Usage, snapshot, usage
from benchmarks.tts_load import BASELINE, NEW, modes_arg

RATE = 24000
THINKER = dict(vocab_size=4096, hidden_size=512, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=2,
               head_dim=64, moe_intermediate_size=256, num_experts=32, num_experts_per_tok=4, intermediate_size=512,
               rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [12, 10, 10],
                                "interleaved": True})
PLACEMENTS = ("qwen3-omni", "qwen3-omni-split")
TALKER_NODES = ("talker", "talker_in", "predictor_in", "code_predictor", "code_predictor_step", "frame")


@dataclass(frozen=True)
class Workload:
    path: Path
    requests: int
    tokens: int
    frames: int
    threads: int


@dataclass
class Answer:
    """One request: when it was sent, when each audio chunk arrived (and its samples), its frames' arrivals."""

    t0: float
    end: float = 0.0
    chunks: list[tuple[float, int]] = field(default_factory=list)
    frames: list[float] = field(default_factory=list)
    codes: list[bytes] = field(default_factory=list)  # each frame's 16 codes, int64 bytes

    @property
    def audio_s(self) -> float:
        return sum(n for _, n in self.chunks) / RATE

    @property
    def ttfa(self) -> float:
        return self.chunks[0][0] - self.t0 if self.chunks else float("nan")

    def misses(self) -> tuple[int, int]:
        """(late chunks, chunks after the first): chunk k is late when it arrives after chunks < k played out."""
        if len(self.chunks) < 2:
            return 0, 0
        start, played, late = self.chunks[0][0], self.chunks[0][1], 0
        for t, n in self.chunks[1:]:
            late += t > start + played / RATE
            played += n
        return late, len(self.chunks) - 1


@dataclass
class Level:
    answers: list[Answer]
    seconds: float
    busy: dict[str, float] = field(default_factory=dict)
    cpu: Usage | None = None

    def audio_per_s(self) -> float:
        return sum(a.audio_s for a in self.answers) / self.seconds

    def audio_per_cpu_s(self) -> float:
        """Audio seconds per core-second our processes ran (what the figure is when others share the cores)."""
        ours = self.cpu.ours_s if self.cpu else 0.0
        return sum(a.audio_s for a in self.answers) / ours if ours else float("nan")

    def rtf(self, q: float) -> float:
        return pct([(a.end - a.t0) / a.audio_s for a in self.answers if a.audio_s], q)


def prompt(processor, i: int) -> list[int]:
    messages = [{"role": "user", "content": f"Tell me about the number {i} in a few words."}]
    request, _ = processor.thinker_request("chat", {"messages": messages}, processor.check_params({}))
    return request.input_ids


# ---- transformers, one request at a time --------------------------------------------------------------
def reference(work: Workload) -> tuple[Level, list[list[bytes]]]:
    import torch
    from transformers import Qwen3OmniMoeForConditionalGeneration

    from walkserve.models.qwen3_omni.processor import Qwen3OmniProcessor

    torch.set_num_threads(work.threads)
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(work.path, dtype=torch.float32).eval()
    processor = Qwen3OmniProcessor(work.path)
    decode, seen = model.code2wav.chunked_decode, {}

    def spy(codes, **kwargs):  # the codes [1, 16, F] generate() decodes
        seen["codes"] = codes[0].T.contiguous()
        return decode(codes, **kwargs)

    model.code2wav.chunked_decode = spy

    def run(i: int, tokens: int, frames: int) -> Answer:
        ids = torch.tensor([prompt(processor, i)])
        answer, tokens = Answer(time.perf_counter()), tokens + 1  # + 1: its talker drops the last thinker token
        seen.clear()
        with torch.no_grad():
            _, wav = model.generate(ids, attention_mask=torch.ones_like(ids), return_audio=True, speaker="ethan",
                                    thinker_max_new_tokens=tokens, thinker_min_new_tokens=tokens,
                                    thinker_do_sample=False, talker_max_new_tokens=frames + 1,
                                    talker_do_sample=False, talker_repetition_penalty=1.0)
        answer.end = time.perf_counter()
        answer.chunks.append((answer.end, wav.numel() if wav is not None else 0))  # the whole waveform at the end
        answer.codes = [row.numpy().tobytes() for row in seen.get("codes", torch.zeros(0, 16, dtype=torch.long))]
        return answer

    run(0, 2, 2)  # warm-up
    t0, before = time.perf_counter(), snapshot()
    answers = [run(i, work.tokens, work.frames) for i in range(work.requests)]
    seconds = time.perf_counter() - t0
    return Level(answers, seconds, cpu=usage(before, snapshot(), seconds)), [a.codes for a in answers]


# ---- walkserve -----------------------------------------------------------------------------------------
def served(work: Workload, placement: str, concurrency: list[int]) -> dict[int, Level]:
    return asyncio.run(_served(work, placement, concurrency))


async def _served(work: Workload, placement: str, concurrency: list[int]) -> dict[int, Level]:
    from walkserve.core.config import RuntimeConfig
    from walkserve.entrypoint.engine import AsyncEngine
    from walkserve.placements import path as placement_path

    config = RuntimeConfig(worker_threads=work.threads, status_interval_s=0.05, max_running=64)
    engine = await AsyncEngine.start("qwen3-omni", str(placement_path(placement)), config=config,
                                     model_path=str(work.path))
    try:
        await asyncio.gather(*[_one(engine, work, i, 2, 2) for i in range(2)])  # warm-up
        out = {}
        for c in concurrency:
            out[c] = await _level(engine, work, c)
    finally:
        await engine.shutdown()
    return out


async def _level(engine, work: Workload, concurrency: int) -> Level:
    gate, before = asyncio.Semaphore(concurrency), await _busy(engine)

    async def gated(i: int) -> Answer:
        async with gate:
            return await _one(engine, work, i, work.tokens, work.frames)

    t0, cpu = time.perf_counter(), snapshot()
    answers = await asyncio.gather(*[gated(i) for i in range(max(work.requests, concurrency))])
    seconds = time.perf_counter() - t0
    cpu = usage(cpu, snapshot(), seconds)
    after = await _busy(engine)
    return Level(list(answers), seconds, {k: after[k] - before[k] for k in after}, cpu)


async def _one(engine, work: Workload, i: int, tokens: int, frames: int) -> Answer:
    from walkserve.core.outputs import OutputEvent
    from walkserve.core.sampling import SamplingParams

    answer = Answer(time.perf_counter())
    sampling = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    payload = {"inputs": {"prompt_token_ids": prompt(engine.processor, i)}, "modalities": ["text", "audio"]}
    spec = engine.processor.build_request("generate", payload, sampling, engine.processor.check_params({"max_audio_frames": frames}))
    async for event in engine.generate(spec):
        now = time.perf_counter()
        if isinstance(event, OutputEvent):
            if event.modality == "audio":
                answer.chunks.append((now, event.data.numel))
            elif event.modality == "latent":  # one frame's 16 codes, int64, in order
                answer.frames.append(now)
                answer.codes.append(event.data.data)
        elif event.error:
            raise RuntimeError(f"request failed: {event.error}")
    answer.end = time.perf_counter()
    return answer


async def _busy(engine) -> dict[str, float]:
    await asyncio.sleep(0.2)  # the next status tick
    nodes = engine.stats().nodes
    busy = lambda names: sum(nodes.get(n, {}).get("busy_s", 0.0) for n in names)  # noqa: E731
    return {"thinker": busy(("thinker",)), "talker": busy(TALKER_NODES), "codec": busy(("code2wav",))}


# ---- the report ----------------------------------------------------------------------------------------
def _check(level: Level, ref_codes: list[list[bytes]]) -> str:
    """How many of the first answers have all 16 codes of every frame equal to the reference's."""
    got = [a.codes for a in level.answers[: len(ref_codes)]]
    same = sum(g == r for g, r in zip(got, ref_codes))
    counts = "" if same == len(ref_codes) else " (frames " + ", ".join(
        f"{len(g)} vs {len(r)}" for g, r in zip(got, ref_codes) if g != r) + ")"
    return f"{same}/{len(ref_codes)} codes equal{counts}"


def _row(name: str, c: int, level: Level, ref: Level, ref_codes: list[list[bytes]] | None) -> tuple:
    late = [a.misses() for a in level.answers]
    misses = sum(x for x, _ in late) / max(1, sum(n for _, n in late))
    busy = sum(level.busy.values()) or 1.0
    split = " / ".join(f"{level.busy[k] / busy:.0%}" for k in ("thinker", "talker", "codec")) if level.busy else ""
    t25 = [a.frames[24] - a.t0 for a in level.answers if len(a.frames) >= 25]
    check = "" if ref_codes is None else _check(level, ref_codes)
    return (name, c, level.audio_per_s(), level.audio_per_s() / ref.audio_per_s(), level.audio_per_cpu_s(), pct([a.ttfa for a in level.answers], 0.5)
            * 1e3, mean(t25) * 1e3 if t25 else float("nan"), level.rtf(0.5), level.rtf(0.95), f"{misses:.0%}", split,
            check)


def _decoded_frames(frames: int) -> int:
    """Frames Code2Wav decodes for an answer of ``frames`` under LeftContext(25, 25): each chunk after the first
    decodes its 25 frames of context again."""
    return frames + 25 * max(0, -(-frames // 25) - 1)


def _ttfa_target(level: Level, c: int) -> str:
    """TTFA of the answers with >= 25 frames against their 25th frame's arrival plus one 25-frame Code2Wav chunk
    (the level's Code2Wav busy seconds per decoded frame, x 25)."""
    decoded = sum(_decoded_frames(len(a.frames)) for a in level.answers)
    chunk = 25 * level.busy.get("codec", float("nan")) / decoded if decoded else float("nan")
    pairs = [(a.ttfa, a.frames[24] - a.t0 + chunk) for a in level.answers if len(a.frames) >= 25]
    short = [a.ttfa - (a.frames[-1] - a.t0) for a in level.answers if 0 < len(a.frames) < 25]
    met = sum(t <= b for t, b in pairs)
    if not pairs:
        return f"TTFA at concurrency {c}: no answer of >= 25 frames"
    text = (f"TTFA at concurrency {c}, answers of >= 25 frames: p50 {pct([t for t, _ in pairs], 0.5) * 1e3:.0f} ms "
            f"against the 25th frame's arrival + one 25-frame Code2Wav chunk ({chunk * 1e3:.0f} ms): p50 "
            f"{pct([b for _, b in pairs], 0.5) * 1e3:.0f} ms; {met}/{len(pairs)} within it "
            f"(target: {'met' if pairs and met == len(pairs) else 'MISSED'})")
    if short:
        text += (f"; the {len(short)} shorter answers' one chunk came {mean(short) * 1e3:.0f} ms after their last frame "
                 "on average (the talker's codec-EOS step, then the decode)")
    return text


def report(work: Workload, refs: list[Level], ref_codes: list[list[bytes]], runs: dict[str, dict[int, Level]],
           load) -> str:
    """``refs``: the reference first (and again after the placements outside --quick); ratios are to the faster."""
    ref = max(refs, key=Level.audio_per_s)
    names = ["(ref) transformers, 1 at a time", "(ref) again, after the placements"]
    rows = [_row(names[i], 1, r, ref, None) for i, r in enumerate(refs)]
    for name, levels in runs.items():
        for c, level in levels.items():
            rows.append(_row(f"walkserve {name}", c, level, ref, ref_codes))
    lines = ["## Qwen3-Omni spoken answers (`./dev bench omni`)", "",
             f"- workload: {work.requests} text turns (more at higher concurrency), {work.tokens} thinker tokens each "
             f"({work.tokens + 1} on (ref), whose talker drops the last) (greedy, EOS ignored), then at most "
             f"{work.frames} codec frames ({work.frames / 12.5:g} s), greedy talker",
             f"- machine: {conditions()}; torch threads per case / per worker: {work.threads}; load average "
             f"{load[0]:.2f} before, {load[1]:.2f} after",
             f"- x (ref): against the faster of the {len(refs)} reference run(s) (the other work on a shared machine "
             "changes while the cases run)", "",
             table(["case", "concurrency", "audio s / wall s", "x (ref)", "audio s / CPU s", "TTFA p50 ms", "25th frame ms", "RTF p50",
                    "RTF p95", "deadline misses", "busy thinker / talker / codec", "check"], rows), ""]
    lines += ["Where the wall time went (/proc: core-seconds of our processes and of the rest of the machine; each "
              "worker's busiest thread, its executor thread):", ""]
    lines += [f"- {names[i]}: {r.cpu.line() if r.cpu else ''}" for i, r in enumerate(refs)]
    lines += [f"- {name} at {c}: {level.cpu.line() if level.cpu else ''}" for name, levels in runs.items()
              for c, level in levels.items()]
    lines.append("")
    for name, levels in runs.items():
        top, low = levels[max(levels)], levels[min(levels)]
        ratio = top.audio_per_s() / ref.audio_per_s()
        lines.append(f"- {name}: audio s per wall s at concurrency {max(levels)} = {ratio:.2f} x (ref) (target >= 3: "
                     f"{'met' if ratio >= 3 else 'MISSED'}); {_ttfa_target(low, min(levels))}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="./dev bench omni", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the tiny checkpoint, 2 requests, 6 tokens, 30 frames, "
                   "one placement at concurrency 2 (a smoke run)")
    p.add_argument("--threads", type=int, default=1, help="torch threads for the reference and each worker")
    p.add_argument("--placements", default=None, help="comma-separated shipped placements")
    p.add_argument("--load", action="store_true", help="instead: real-time streams under offered load, capacity "
                   "admission + deadline scheduling against count + fifo (benchmarks/omni_load.py)")
    p.add_argument("--sweep-modes", default=f"{NEW},{BASELINE}", type=modes_arg, help="with --load: the modes")
    p.add_argument("--plot", default="", help="with --load: where the SVG goes (default: none)")
    p.add_argument("--frames", type=int, default=0, help="with --load: frames per stream (default: 30 quick, "
                   "50 full; 100 = four 25-frame chunks, a stream that must stay real-time past its first chunk)")
    args = p.parse_args(argv)
    if args.load:
        from benchmarks.omni_load import run_load

        print(run_load(args.quick, args.threads, args.sweep_modes, args.plot, frames=args.frames))
        return 0
    from walkserve.models.qwen3_omni.tiny import write_tiny_qwen3_omni

    concurrency = [2] if args.quick else [1, 4, 16]
    placements = (args.placements or ("qwen3-omni" if args.quick else ",".join(PLACEMENTS))).split(",")
    before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="walkserve-bench-omni-speech-") as tmp:
        path = write_tiny_qwen3_omni(Path(tmp) / "qwen3-omni-speech-bench", seed=5, speech=True,
                                     **({} if args.quick else THINKER))
        work = Workload(path, 2 if args.quick else 4, 6 if args.quick else 32, 30 if args.quick else 75, args.threads)
        print(f"reference: {work.requests} requests ...", flush=True)
        ref, ref_codes = reference(work)
        runs = {}
        for name in placements:
            print(f"walkserve {name}: concurrency {concurrency} ...", flush=True)
            runs[name] = served(work, name, concurrency)
        refs = [ref]
        if not args.quick:
            print("reference again ...", flush=True)
            refs.append(reference(work)[0])
        print()
        print(report(work, refs, ref_codes, runs, (before, os.getloadavg()[0])))
    return 0
