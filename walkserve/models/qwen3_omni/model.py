"""Qwen3OmniThinker: the ``qwen3-omni`` family served with text out — the thinker LM and its two encoders.

    ModelRef(family="qwen3-omni", path=<checkpoint dir>, options={"model_id", "kv": {...}, "encoder_max_batch",
                                                                  "speech": True})

Components (``graph.py`` names the nodes alike):

    thinker         ThinkerLM on the KV engine (context "main", [3, T] positions, deepstack token input)
    audio_encoder   AudioEncoder, stateless (when the checkpoint has thinker.audio_tower)
    vision_encoder  VisionEncoder, stateless (when it has thinker.visual; -Captioner has none)

Only ``thinker.*`` is read (speech is off): the shards holding only the talker
and Code2Wav are never opened. Importing this module imports no torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

from walkserve.core.errors import ConfigError
from walkserve.engines.spec import BuildContext, ComponentSpec
from walkserve.graph.walk import WalkGraph
from walkserve.models.base import Model, ModelRef
from walkserve.models.common.kv_sizing import kv_bytes_per_token, kv_pool_bytes
from walkserve.models.common.memory_report import components_per_rank
from walkserve.models.common.safetensors_files import DTYPE_ITEMSIZE
from walkserve.models.qwen3_omni import memory
from walkserve.models.qwen3_omni.config import Qwen3OmniConfig
from walkserve.models.qwen3_omni.graph import AUDIO_ENCODER, THINKER, VISION_ENCODER, build_graph
from walkserve.models.qwen3_omni.processor import OmniParams, Qwen3OmniProcessor
from walkserve.models.qwen3_omni.speech.config import SpeechConfig
from walkserve.models.qwen3_omni.speech.graph import (
    CODE2WAV,
    GLUE,
    PREDICTOR,
    TALKER,
    DepthRanges,
    build_speech_graph,
)
from walkserve.models.qwen3_omni.speech.rules import code0_ranges
from walkserve.placement.plan import Placement

DEFAULT_KV_OPTIONS = {"block_size": 16}
# the speech half's KV pools (options "talker_kv" / "predictor_kv" replace them): the talker holds a request's
# user turn + 9 + one row per frame (20 KiB per token on the release), the predictor 16 rows per request
SPEECH_KV_BYTES = {"talker": 256 * 2**20, "code_predictor": 64 * 2**20}
ENCODER_MAX_BATCH = 8  # items per encoder pass: a batch holds every waiting request's media back until it ends


def _build(kind: str, path: Path, ctx: BuildContext) -> Any:
    # imports torch: only in the worker that loads it
    from walkserve.models.qwen3_omni.speech import build as speech_build
    from walkserve.models.qwen3_omni.thinker import weights

    builder = {THINKER: weights.build_thinker, AUDIO_ENCODER: weights.build_audio_encoder,
               VISION_ENCODER: weights.build_vision_encoder, **speech_build.BUILDERS}[kind]
    return builder(ctx, path)


class Qwen3OmniThinker(Model):
    """Text, audio, images and video in; text out (streamed), through the walks of ``graph.py``."""

    params_type = OmniParams

    def __init__(self, ref: ModelRef):
        self.ref = ref
        self.path = Path(ref.path) if ref.path else None
        if self.path is not None and not (self.path / "config.json").is_file():
            raise ConfigError(f"{self.path}: not a Qwen3-Omni checkpoint directory (no config.json)")
        self.config = Qwen3OmniConfig.from_file(self.path) if self.path else None
        self.speech = speech_config(self.path) if self.path and ref.options.get("speech", True) else None

    def for_placement(self, placement: Mapping[str, Any]) -> Model:
        """A placement that does not place the talker serves the checkpoint with text out only (speech off)."""
        placed = {n for entry in placement.get("nodes") or () for n in entry.get("nodes") or ()}
        if self.speech is None or TALKER in placed:
            return self
        return Qwen3OmniThinker(dataclasses.replace(self.ref, options={**self.ref.options, "speech": False}))

    def graph(self) -> WalkGraph:
        c, s = self.config, self.speech
        audio, vision = c is None or c.audio is not None, c is None or c.vision is not None
        if s is None:
            return build_graph(audio=audio, vision=vision)
        return build_speech_graph(code0_ranges(s.talker.vocab_size, s.tokens.codec_eos),
                                  DepthRanges(s.code_predictor.codebook_size), s.num_code_groups,
                                  s.accept_hidden_layer, audio=audio, vision=vision,
                                  frame_s=s.code2wav.frame_samples / s.code2wav.sampling_rate)

    def _path(self) -> Path:
        if self.path is None:
            raise ConfigError("model family 'qwen3-omni' needs its checkpoint directory (--model-path)")
        return self.path

    def kv_defaults(self) -> Mapping[str, Any]:
        return DEFAULT_KV_OPTIONS

    def components(self) -> dict[str, ComponentSpec]:
        path, c = self._path(), self.config
        stored = memory.stored_bytes(path)
        per_token = self.kv_bytes_per_token()
        options = self.kv_options()
        out = {THINKER: ComponentSpec(
            THINKER, "kv", partial(_build, THINKER, path), weight_bytes=stored.get(THINKER, 0),
            state_bytes=partial(kv_pool_bytes, options, per_token), stateful=True, options=options)}
        batch = int(self.ref.options.get("encoder_max_batch", ENCODER_MAX_BATCH))
        for name, present in ((AUDIO_ENCODER, c.audio), (VISION_ENCODER, c.vision)):
            if present is not None:
                out[name] = ComponentSpec(name, "stateless", partial(_build, name, path),
                                          weight_bytes=stored.get(name, 0), options={"max_batch": batch})
        if self.speech is not None:
            out.update(self._speech_components(path))
        return out

    def _speech_components(self, path: Path) -> dict[str, ComponentSpec]:
        s = self.speech
        assert s is not None
        sizes = memory.speech_bytes(path)
        talker_kv = kv_bytes_per_token(s.talker.num_hidden_layers, s.talker.num_key_value_heads,
                                       s.talker.head_dim, DTYPE_ITEMSIZE[s.dtype])
        a = s.code_predictor.attention
        cp_kv = kv_bytes_per_token(a.num_hidden_layers, a.num_key_value_heads, a.head_dim, DTYPE_ITEMSIZE[s.dtype])
        kv = lambda name, per_token: ComponentSpec(  # noqa: E731
            name, "kv", partial(_build, name, path), weight_bytes=sizes[name],
            state_bytes=partial(kv_pool_bytes, self.speech_kv(name), per_token), stateful=True,
            options=self.speech_kv(name))
        return {
            TALKER: kv(TALKER, talker_kv), PREDICTOR: kv(PREDICTOR, cp_kv),
            GLUE: ComponentSpec(GLUE, "stateless", partial(_build, GLUE, path), weight_bytes=sizes[GLUE],
                                options={"max_batch": 64}),
            CODE2WAV: ComponentSpec(CODE2WAV, "stateless", partial(_build, CODE2WAV, path),
                                    weight_bytes=sizes[CODE2WAV], options={"max_batch": 16}),
        }

    def speech_kv(self, component: str) -> dict[str, Any]:
        """KV options of the talker or the code predictor."""
        key = "talker_kv" if component == TALKER else "predictor_kv"
        return {**DEFAULT_KV_OPTIONS, "kv_bytes": SPEECH_KV_BYTES[component], **dict(self.ref.options.get(key) or {})}

    def kv_bytes_per_token(self, dtype: str | None = None) -> int:
        t = self._config().text
        return kv_bytes_per_token(t.num_hidden_layers, t.num_key_value_heads, t.head_dim,
                                  DTYPE_ITEMSIZE[dtype or self._config().dtype])

    def _config(self) -> Qwen3OmniConfig:
        if self.config is None:
            raise ConfigError("model family 'qwen3-omni' needs its checkpoint directory (--model-path)")
        return self.config

    def processor(self) -> Qwen3OmniProcessor:
        return Qwen3OmniProcessor(self._path(), model_id=self.ref.options.get("model_id"), speech=self.speech)

    def memory_report(self, placement: Placement,
                      device_memory: Callable[[str], int | None] | None = None) -> list[str]:
        """Per rank: weights (as stored), KV per token, the pool; PlacementError when a rank cannot hold them."""
        path = self._path()
        hosted = components_per_rank(self.graph(), placement)
        stored = memory.stored_bytes(path)
        loaded = {c: b for c, b in stored.items() if c not in memory.SPEECH}
        pools = {}
        if self.speech is not None:
            loaded.update(memory.speech_bytes(path))
            pools = {c: int(self.speech_kv(c)["kv_bytes"]) for c in (TALKER, PREDICTOR)
                     if "kv_bytes" in self.speech_kv(c)}
        ranks = memory.rank_memory(placement, hosted, loaded, self.kv_bytes_per_token(), self.kv_options(),
                                   self._config().dtype, device_memory, pools)
        speech = sum(stored.get(c, 0) for c in memory.SPEECH)
        thinker = sum(stored.get(c, 0) for c in (THINKER, AUDIO_ENCODER, VISION_ENCODER)) / memory.GIB
        if self.speech is None:
            head = f"is loaded (talker + Code2Wav {speech / memory.GIB:.2f} GiB not read: speech out is off)"
        else:
            head = (f"and the speech half {speech / memory.GIB:.2f} GiB are loaded (the talker also holds a copy of the "
                    f"thinker's embedding table)")
        lines = [f"checkpoint {path.name}: {sum(stored.values()) / memory.GIB:.2f} GiB as stored; the thinker's share "
                 f"{thinker:.2f} GiB {head}"]
        lines += [r.describe() for r in ranks]
        memory.check_fits(ranks, placement.source)
        return lines


def speech_config(path: Path) -> SpeechConfig | None:
    """The checkpoint's speech half, or None for a thinker-only checkpoint (text out only)."""
    try:
        return SpeechConfig.from_file(path)
    except ConfigError:
        return None


def build(ref: ModelRef) -> Qwen3OmniThinker:
    """Registry factory of the ``qwen3-omni`` family."""
    return Qwen3OmniThinker(ref)
