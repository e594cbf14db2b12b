"""A long codec step blocks its rank: is admission by the capacity model still safe? On a virtual clock.

A Qwen3-Omni-like rank: a talker-like loop (one step per 80 ms frame, the
whole frame's path in one call, 12 ms + 1 ms per stream) streams 25-frame
chunks (2 s of audio) into a gathering codec (Code2Wav: 60 ms per stream's
chunk, no batching gain, so a call for 12 streams holds the rank 0.72 s while
every other stream's frames wait). Two groups of streams start 1 s apart, so
one group's codec call lands in the middle of the other's chunk. The capacity
model (``conductor.capacity.StreamCapacity``) learns from the rank's step
counters and audio as it does in a server; every load it admits must then
play without a gap at the client (``gaps``), even though the codec's single
steps are far longer than the headroom it leaves (0.2 x 2 s).
"""

from __future__ import annotations

import torch

from tests.worker.test_stream_scheduling import LM
from tests.worker.virtual_clock import Clock, TimedEngine, drive, gaps
from walkserve.conductor.capacity import StreamCapacity
from walkserve.core.sampling import SamplingParams
from walkserve.core.scheduling import StreamScheduling
from walkserve.engines.base import Group
from walkserve.engines.values import concat
from walkserve.graph import (
    Client,
    GraphEdge,
    GraphNode,
    Parallel,
    Playback,
    StreamingGraphEdge,
    Walk,
    WalkGraph,
)
from walkserve.models.llama.graph import LM as TALKER_NODE
from walkserve.models.llama.graph import decode_loop, prompt_state_machine
from walkserve.models.orpheus.processor import SpeechParams
from walkserve.models.orpheus.tokens import AUDIO_CODE_BASE, allowed_ranges
from walkserve.protocol import messages as m
from walkserve.streaming.policy import FixedChunk
from walkserve.worker.executor import Executor

RATE, FRAME_S, CHUNK = 24_000, 0.08, 25
TALKER, CODEC = (0.012, 0.001), 0.06  # a frame's path: fixed + per stream; a chunk's decode per stream


def omni_like_graph() -> WalkGraph:
    loop = decode_loop({"token_ranges": allowed_ranges})  # its node is the LM's ("lm"): the talker here
    codec = GraphNode("code2wav", inputs=["codes"], outputs=["audio"])
    walk = Walk("decode", Parallel(loop, codec), inputs=["last"], edges=[
        GraphEdge("input.last", f"{TALKER_NODE}.tokens"),
        StreamingGraphEdge(f"{TALKER_NODE}.token", "code2wav.codes", FixedChunk(CHUNK)),
        GraphEdge("code2wav.audio", Client("audio")),
    ], playback={TALKER_NODE: Playback(FRAME_S, every=CHUNK), "code2wav": Playback(CHUNK * FRAME_S)})
    return WalkGraph("omni-like", [walk], prompt_state_machine())


class Code2Wav(TimedEngine):
    gathers = True

    def answer(self, group: Group, i: int) -> dict:
        return {"audio": torch.zeros(int(group.spans[i]["codes"].n_items * FRAME_S * RATE))}


def run(streams: int) -> tuple[dict[str, list[tuple[float, float]]], Executor]:
    """Each stream's chunks as (arrival, seconds of audio), and the executor. Three quarters of the streams
    start at 0, the rest at 1 s; each makes 150 frames (six chunks)."""
    clock = Clock()
    engines = {TALKER_NODE: LM(TALKER_NODE, clock, *TALKER, None), "code2wav": Code2Wav("code2wav", clock, 0.0, CODEC, None)}
    ex = Executor(0, omni_like_graph(), engines, concat, scheduling=StreamScheduling(), clock=clock)
    late = streams // 4
    starts = [(0.0 if i < streams - late else 1.0,
               m.StartWalk(f"s{i}", "decode", {TALKER_NODE: 0, "code2wav": 0}, {"last": torch.tensor([AUDIO_CODE_BASE])},
                           SpeechParams(), SamplingParams(max_tokens=150), stream=True)) for i in range(streams)]
    return drive(ex, clock, starts, RATE), ex


def test_a_long_codec_step_is_priced_in_the_ranks_time_so_every_admitted_load_plays():
    """The codec's call stalls the talker's steps of the other streams, but that stall is the codec's time on
    the rank, which the model counts (its steps per audio second x its step time at the batch): within the
    estimate no stream gaps, with steps of 0.5 s and more. Past where the rank is busy all the time, streams
    gap, so the check can fail."""
    audio, ex = run(12)
    model = StreamCapacity(0.8)
    model.add_audio(sum(s for chunks in audio.values() for _, s in chunks))
    model.observe(0, ex.stats().step_counts)
    capacity = model.capacity()
    busy = (CHUNK * (TALKER[0] + TALKER[1] * capacity) + CODEC * capacity) / (CHUNK * FRAME_S)
    assert 12 <= capacity <= 16 and busy <= 0.8 + 1e-9  # the table's own: (25 x 13 ms + 60 ms) x b / 2 s
    for n in (12, capacity):
        audio, ex = run(n)
        longest = max(ex.engines["code2wav"].batches) * CODEC
        assert longest >= 0.5  # one codec step held the rank longer than the headroom's 0.4 s of a chunk
        assert sum(gaps(chunks) for chunks in audio.values()) == 0, n
    audio, _ = run(22)  # the rank busy 1.09 s per second of audio: it falls behind
    assert sum(gaps(chunks) for chunks in audio.values()) > 0
