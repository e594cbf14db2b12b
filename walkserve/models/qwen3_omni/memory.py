"""What each rank of a Qwen3-Omni placement holds, with the checkpoint's real sizes (torch-free).

    rank 0 (cuda:0, 139.72 GiB): weights 59.07 GiB = thinker 56.87 GiB + audio_encoder 1.21 GiB + vision_encoder
        1.00 GiB; KV 96.0 KiB per token (bf16), pool 40.33 GiB = 440,528 tokens; total 99.40 GiB

Weights are counted from the safetensors headers (no tensor is read), per
component prefix, as stored (the release is bf16): the thinker LM
(``thinker.model``, ``thinker.lm_head``), the encoders (``thinker.audio_tower``,
``thinker.visual``); ``talker.*`` and ``code2wav.*`` are listed but not loaded
while speech is off. The thinker's KV per token is 2 (K and V) x layers x KV
heads x head_dim x the dtype's bytes. The pool is what the KV engine will
allocate: the component's ``kv_bytes`` or ``num_blocks`` option, else the
device default (``placement.memory.default_kv_bytes``: 256 MiB on a CPU, half
the memory left once the weights are in on a GPU). A rank whose budget (its
``memory:`` in the placement, else the GPU's memory) cannot hold its weights
plus its pool is refused, with these numbers.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from walkserve.core.errors import ConfigError, PlacementError
from walkserve.models.common.kv_sizing import has_pool_size, kv_pool_bytes
from walkserve.models.common.memory_report import GIB, KIB, rank_budget
from walkserve.models.common.safetensors_files import (
    INDEX_FILE,
    ITEMSIZE,
    read_header,
    weight_files,
)
from walkserve.placement.plan import Placement

# checkpoint name prefix -> component; the first that matches wins (the encoders before the thinker's own)
PREFIXES = (("thinker.audio_tower.", "audio_encoder"), ("thinker.visual.", "vision_encoder"), ("thinker.", "thinker"),
            ("talker.", "talker"), ("code2wav.", "code2wav"))
SPEECH = ("talker", "code2wav")


def _stamp(directory: str | Path) -> tuple[str, tuple[tuple[str, int, int], ...]]:
    """The directory and its weight files' names, sizes and times: a key under which their headers stay the same."""
    root = Path(directory).resolve()
    files = sorted(root.glob("*.safetensors*"))
    return str(root), tuple((f.name, f.stat().st_mtime_ns, f.stat().st_size) for f in files)


def stored_bytes(directory: str | Path) -> dict[str, int]:
    """Bytes of each component's tensors as stored, from the headers of the shards that hold them (read once per
    checkpoint: the planner asks for every candidate placement)."""
    return dict(_stored_bytes(*_stamp(directory)))


def speech_bytes(directory: str | Path) -> dict[str, int]:
    """Bytes each speech component holds once loaded, from the headers: the talker (with its copies of the
    thinker's embedding table and the predictor's 15 code tables), the code predictor, the glue (a copy of the
    talker's codec table) and Code2Wav (float32)."""
    return dict(_speech_bytes(*_stamp(directory)))


@functools.lru_cache(maxsize=8)
def _stored_bytes(directory: str, stamp: tuple) -> dict[str, int]:
    out: dict[str, int] = {}
    for path in weight_files(directory):
        for name, entry in read_header(path).items():
            part = next((c for prefix, c in PREFIXES if name.startswith(prefix)), None)
            if part is None:
                continue
            n = 1
            for s in entry["shape"]:
                n *= int(s)
            out[part] = out.get(part, 0) + n * ITEMSIZE.get(entry["dtype"], 4)
    return out


def shards_of(directory: str | Path, component_prefix: str) -> list[str]:
    """The shard files that hold any tensor under ``component_prefix`` (what loading it opens)."""
    index = Path(directory) / INDEX_FILE
    if not index.is_file():
        return [p.name for p in weight_files(directory)]
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ConfigError(f"{index}: not a safetensors index ({e})") from None
    return sorted({f for n, f in weight_map.items() if n.startswith(component_prefix)})


@dataclass(frozen=True)
class RankMemory:
    """One rank's share: weights per component, the KV pool (when the thinker is there), the budget."""

    rank: int
    device: str
    budget: int | None
    weights: dict[str, int] = field(default_factory=dict)
    kv_per_token: int = 0
    pool: int = 0
    kv_dtype: str = "bfloat16"
    speech_pools: dict[str, int] = field(default_factory=dict)  # the talker's and code predictor's KV pools

    @property
    def total(self) -> int:
        return sum(self.weights.values()) + self.pool + sum(self.speech_pools.values())

    def describe(self) -> str:
        budget = f", {self.budget / GIB:.2f} GiB" if self.budget is not None else ""
        parts = " + ".join(f"{c} {b / GIB:.2f} GiB" for c, b in self.weights.items()) or "none"
        line = f"rank {self.rank} ({self.device}{budget}): weights {sum(self.weights.values()) / GIB:.2f} GiB = {parts}"
        if self.kv_per_token:
            tokens = self.pool // self.kv_per_token
            line += (f"; KV {self.kv_per_token / KIB:.1f} KiB per token ({self.kv_dtype}), pool {self.pool / GIB:.2f} GiB"
                     f" = {tokens:,} tokens")
        if self.speech_pools:
            line += "; " + ", ".join(f"{c} pool {b / GIB:.2f} GiB" for c, b in self.speech_pools.items())
        return line + f"; total {self.total / GIB:.2f} GiB"


def rank_memory(placement: Placement, hosted: Mapping[int, list[str]], weights: Mapping[str, int], kv_per_token: int,
                kv_options: Mapping, kv_dtype: str, device_memory: Callable[[str], int | None] | None,
                speech_pools: Mapping[str, int] | None = None) -> list[RankMemory]:
    """Each rank's share; ``hosted``: rank -> the components placed there; ``device_memory``: a GPU's memory."""
    out = []
    for rank, spec in sorted(placement.ranks.items()):
        comps = hosted.get(rank, [])
        budget = rank_budget(spec, device_memory)
        w = {c: weights[c] for c in comps if weights.get(c)}
        pool = 0
        if "thinker" in comps:
            free = None if budget is None else max(0, budget - sum(w.values()))
            if spec.device != "cpu" and free is None and not has_pool_size(kv_options):
                pool = 0  # a GPU whose memory is unknown here: its pool is sized when it starts
            else:
                pool = kv_pool_bytes(kv_options, kv_per_token, spec.device, free)
        per_token = kv_per_token if "thinker" in comps else 0
        extra = {c: b for c, b in (speech_pools or {}).items() if c in comps}
        out.append(RankMemory(rank, spec.device, budget, w, per_token, pool, kv_dtype, extra))
    return out


def check_fits(ranks: list[RankMemory], source: str) -> None:
    """PlacementError for the first rank whose budget cannot hold its weights and pool, with the numbers."""
    for r in ranks:
        if r.budget is not None and r.total > r.budget:
            raise PlacementError(f"{source}: Qwen3-Omni does not fit: {r.describe()}, over the budget of "
                                 f"{r.budget / GIB:.2f} GiB by {(r.total - r.budget) / GIB:.2f} GiB "
                                 f"(a smaller pool: kv_bytes / --kv-blocks; or another placement)")


@functools.lru_cache(maxsize=8)
def _speech_bytes(directory: str, stamp: tuple) -> dict[str, int]:
    out = {"talker": 0, "code_predictor": 0, "talker_glue": 0, "code2wav": 0}
    for path in weight_files(directory):
        for name, entry in read_header(path).items():
            n = 1
            for s in entry["shape"]:
                n *= int(s)
            size = n * ITEMSIZE.get(entry["dtype"], 4)
            if name.startswith("talker.code_predictor."):
                out["code_predictor"] += size
                out["talker"] += size if ".codec_embedding." in name else 0
            elif name.startswith("talker."):
                out["talker"] += size
                out["talker_glue"] += size if name == "talker.model.codec_embedding.weight" else 0
            elif name.startswith("code2wav."):
                out["code2wav"] += n * 4  # loaded in float32
            elif name == "thinker.model.embed_tokens.weight":
                out["talker"] += size
    return out
