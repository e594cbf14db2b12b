"""OrpheusTTS: the ``orpheus`` family — a Llama LM on the KV engine streaming audio tokens into a SNAC codec.

    ModelRef(family="orpheus", path=<LM dir>, options={"snac_path": <SNAC dir>, ...})
    ModelRef(family="orpheus", path=<dir with lm/ and snac/>)        (the embedded demo layout, tiny.py)

The LM directory is the official ``canopylabs/orpheus-3b-0.1-ft`` layout
(Llama config + safetensors + tokenizer); the SNAC directory is
``hubertsiuzdak/snac_24khz`` after ``walkserve convert snac`` (config.json +
model.safetensors). Options: ``snac_path``, ``model_id``, ``voices`` (a
fine-tune's voice names), ``kv`` (KVCacheEngine options), ``codec_dtype``
(default float32: the codec is small and its output is what users hear),
``codec_max_batch`` (default 16). Importing this module imports no torch.

Every sampled token is constrained to ``tokens.allowed_ranges`` (audio ids of
the stream position, END_OF_SPEECH), so the LM head computes logits for
``EMITTABLE_RANGES`` only (29k of 157k rows; the rest would be masked anyway).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from walkserve.core.errors import ConfigError
from walkserve.engines.spec import BuildContext, ComponentSpec
from walkserve.graph.walk import WalkGraph
from walkserve.models.base import Model, ModelRef
from walkserve.models.llama.model import DEFAULT_KV_OPTIONS, lm_component
from walkserve.models.orpheus.graph import CODEC, build_graph
from walkserve.models.orpheus.processor import OrpheusProcessor, SpeechParams
from walkserve.models.orpheus.tokens import EMITTABLE_RANGES

SNAC_WEIGHTS, SNAC_PICKLE = "model.safetensors", "pytorch_model.bin"
# windows per SNAC batch: past ~16 rows a batch costs no less per row, and a long batch holds back
# every stream's next chunk until it ends
CODEC_MAX_BATCH = 16


def resolve_dirs(ref: ModelRef) -> tuple[Path, Path]:
    """(LM directory, SNAC directory) of ``ref``; ConfigError naming what is missing."""
    if not ref.path:
        raise ConfigError("model family 'orpheus' needs the Orpheus LM directory (--model-path)")
    root = Path(ref.path)
    embedded = (root / "lm").is_dir() and (root / "snac").is_dir()
    lm = root / "lm" if embedded else root
    snac_opt = ref.options.get("snac_path")
    if snac_opt is None and not embedded:
        raise ConfigError(
            f"{root}: Orpheus needs a SNAC codec directory: set the model option snac_path "
            f"(or give a directory holding lm/ and snac/)"
        )
    snac = Path(snac_opt) if snac_opt is not None else root / "snac"
    if not (lm / "config.json").is_file():
        raise ConfigError(f"{lm}: not an Orpheus LM directory (no config.json)")
    if not (snac / SNAC_WEIGHTS).is_file():
        hint = f"; convert it once with: walkserve convert snac {snac} {snac}" if (snac / SNAC_PICKLE).is_file() else ""
        raise ConfigError(f"{snac}: no SNAC {SNAC_WEIGHTS}{hint}")
    return lm, snac


def codec_component(snac: Path, dtype: str = "float32", max_batch: int = CODEC_MAX_BATCH) -> ComponentSpec:
    """The ``codec`` component: OrpheusCodec (SNAC decoder) on the stateless engine."""

    def build(ctx: BuildContext) -> Any:
        from walkserve.models.orpheus.codec import OrpheusCodec  # imports torch

        return OrpheusCodec.from_dir(snac, device=ctx.device, dtype=dtype)

    return ComponentSpec(
        name=CODEC,
        engine="stateless",
        build=build,
        weight_bytes=(snac / SNAC_WEIGHTS).stat().st_size,
        options={"max_batch": max_batch},
    )


class OrpheusTTS(Model):
    """Orpheus text-to-speech: prompt -> LM audio tokens -> SNAC windows -> 24 kHz audio, streamed."""

    params_type = SpeechParams

    def __init__(self, ref: ModelRef):
        self.ref = ref
        self.dirs = resolve_dirs(ref) if ref.path else None

    def graph(self) -> WalkGraph:
        return build_graph()

    def _dirs(self) -> tuple[Path, Path]:
        if self.dirs is None:
            raise ConfigError("model family 'orpheus' needs the Orpheus LM directory (--model-path)")
        return self.dirs

    def kv_defaults(self) -> Mapping[str, Any]:
        return DEFAULT_KV_OPTIONS  # the LM's: Llama's

    def components(self) -> dict[str, ComponentSpec]:
        lm, snac = self._dirs()
        options = self.ref.options
        codec = codec_component(snac, options.get("codec_dtype", "float32"), int(options.get("codec_max_batch", CODEC_MAX_BATCH)))
        return {"lm": lm_component(lm, self.kv_options(), vocab_ranges=EMITTABLE_RANGES), CODEC: codec}

    def processor(self) -> OrpheusProcessor:
        lm, _ = self._dirs()
        model_id = self.ref.options.get("model_id") or Path(str(self.ref.path)).name
        return OrpheusProcessor(lm, model_id=model_id, voices=self.ref.options.get("voices"))


def build(ref: ModelRef) -> OrpheusTTS:
    """Registry factory of the ``orpheus`` family."""
    return OrpheusTTS(ref)
