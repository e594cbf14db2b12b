"""Qwen3OmniThinker: the ``qwen3-omni`` family served with text out — the thinker LM and its two encoders.

    ModelRef(family="qwen3-omni", path=<checkpoint dir>, options={"model_id", "kv": {...}, "encoder_max_batch"})

Components (``graph.py`` names the nodes alike):

    thinker         ThinkerLM on the KV engine (context "main", [3, T] positions, deepstack token input)
    audio_encoder   AudioEncoder, stateless (when the checkpoint has thinker.audio_tower)
    vision_encoder  VisionEncoder, stateless (when it has thinker.visual; -Captioner has none)

Only ``thinker.*`` is read (speech is off): the shards holding only the talker
and Code2Wav are never opened. Importing this module imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from walkserve.core.errors import ConfigError
from walkserve.graph.walk import WalkGraph
from walkserve.models.base import BuildContext, ComponentSpec, Model, ModelRef
from walkserve.models.qwen3_omni import memory
from walkserve.models.qwen3_omni.config import Qwen3OmniConfig
from walkserve.models.qwen3_omni.graph import AUDIO_ENCODER, THINKER, VISION_ENCODER, build_graph
from walkserve.models.qwen3_omni.processor import Qwen3OmniProcessor
from walkserve.placement.plan import Placement

DEFAULT_KV_OPTIONS = {"block_size": 16}
ENCODER_MAX_BATCH = 8  # items per encoder pass: a batch holds every waiting request's media back until it ends


def _build(kind: str, path: Path, ctx: BuildContext) -> Any:
    # imports torch: only in the worker that loads it
    from walkserve.models.qwen3_omni import weights

    builder = {THINKER: weights.build_thinker, AUDIO_ENCODER: weights.build_audio_encoder,
               VISION_ENCODER: weights.build_vision_encoder}[kind]
    return builder(ctx, path)


class Qwen3OmniThinker(Model):
    """Text, audio, images and video in; text out (streamed), through the walks of ``graph.py``."""

    def __init__(self, ref: ModelRef):
        self.ref = ref
        self.path = Path(ref.path) if ref.path else None
        if self.path is not None and not (self.path / "config.json").is_file():
            raise ConfigError(f"{self.path}: not a Qwen3-Omni checkpoint directory (no config.json)")
        self.config = Qwen3OmniConfig.from_file(self.path) if self.path else None

    def graph(self) -> WalkGraph:
        c = self.config
        return build_graph(audio=c is None or c.audio is not None, vision=c is None or c.vision is not None)

    def _path(self) -> Path:
        if self.path is None:
            raise ConfigError("model family 'qwen3-omni' needs its checkpoint directory (--model-path)")
        return self.path

    def kv_options(self) -> dict[str, Any]:
        return {**DEFAULT_KV_OPTIONS, **dict(self.ref.options.get("kv") or {})}

    def components(self) -> dict[str, ComponentSpec]:
        path, c = self._path(), self.config
        stored = memory.stored_bytes(path)
        per_token = self.kv_bytes_per_token()
        options = self.kv_options()
        out = {THINKER: ComponentSpec(
            THINKER, "kv", partial(_build, THINKER, path), weight_bytes=stored.get(THINKER, 0),
            state_bytes=partial(memory.pool_bytes, options, per_token), stateful=True, options=options)}
        batch = int(self.ref.options.get("encoder_max_batch", ENCODER_MAX_BATCH))
        for name, present in ((AUDIO_ENCODER, c.audio), (VISION_ENCODER, c.vision)):
            if present is not None:
                out[name] = ComponentSpec(name, "stateless", partial(_build, name, path),
                                          weight_bytes=stored.get(name, 0), options={"max_batch": batch})
        return out

    def kv_bytes_per_token(self, dtype: str | None = None) -> int:
        t = self._config().text
        return memory.kv_bytes_per_token(t.num_hidden_layers, t.num_key_value_heads, t.head_dim,
                                         dtype or self._config().dtype)

    def _config(self) -> Qwen3OmniConfig:
        if self.config is None:
            raise ConfigError("model family 'qwen3-omni' needs its checkpoint directory (--model-path)")
        return self.config

    def processor(self) -> Qwen3OmniProcessor:
        return Qwen3OmniProcessor(self._path(), model_id=self.ref.options.get("model_id"))

    def memory_report(self, placement: Placement,
                      device_memory: Callable[[str], int | None] | None = None) -> list[str]:
        """Per rank: weights (as stored), KV per token, the pool; PlacementError when a rank cannot hold them."""
        from walkserve.placement.resolve import walk_nodes

        graph, path = self.graph(), self._path()
        walks = walk_nodes(graph)
        hosted = {rank: sorted({graph.plans[w].nodes[n].component for w, n in placement.nodes_on(rank, walks)})
                  for rank in placement.ranks}
        stored = memory.stored_bytes(path)
        ranks = memory.rank_memory(placement, hosted, stored, self.kv_bytes_per_token(), self.kv_options(),
                                   self._config().dtype, device_memory)
        speech = sum(stored.get(c, 0) for c in memory.SPEECH)
        lines = [f"checkpoint {path.name}: {sum(stored.values()) / memory.GIB:.2f} GiB as stored; the thinker's share "
                 f"{sum(stored.get(c, 0) for c in (THINKER, AUDIO_ENCODER, VISION_ENCODER)) / memory.GIB:.2f} GiB is "
                 f"loaded (talker + Code2Wav {speech / memory.GIB:.2f} GiB not read: speech out is off)"]
        lines += [r.describe() for r in ranks]
        memory.check_fits(ranks, placement.source)
        return lines


def build(ref: ModelRef) -> Qwen3OmniThinker:
    """Registry factory of the ``qwen3-omni`` family."""
    return Qwen3OmniThinker(ref)
