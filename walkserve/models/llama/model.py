"""TextLM: a Llama / Qwen2 / Qwen3 checkpoint served as a model (families ``llama``, ``qwen2``, ``qwen3``).

    ModelRef(family="llama", path=<HF checkpoint dir>, options={"model_id": ..., "kv": {...}})

One component, ``lm``, on the KV-cache engine; the walks are in ``graph.py``.
Importing this module imports no torch: weights are read when a worker
builds the component.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from walkserve.engines.spec import BuildContext, ComponentSpec
from walkserve.graph.walk import WalkGraph
from walkserve.models.base import Model, ModelRef
from walkserve.models.common.config_files import checkpoint_dir
from walkserve.models.common.kv_sizing import has_pool_size, kv_bytes_per_token
from walkserve.models.common.kv_sizing import kv_pool_bytes as common_kv_pool_bytes
from walkserve.models.common.lm_config import LMConfig
from walkserve.models.common.safetensors_files import tensor_bytes
from walkserve.models.llama.graph import build_graph
from walkserve.models.llama.processor import TextLMProcessor, TextParams

# KVCacheEngine keyword options; ModelRef.options["kv"] and runtime engine options override them.
DEFAULT_KV_OPTIONS: Mapping[str, Any] = {"block_size": 16}


PROGRESS_BAR_BYTES = 256 * 2**20


def kv_pool_bytes(path: Path, options: Mapping[str, Any], device: str, free_bytes: int | None) -> int:
    """The KV pool this component will allocate on ``device`` (``free_bytes`` free there once weights are loaded),
    for the placement's memory check: the size the options give, else the engine's default for the device."""
    per_token = 0
    if has_pool_size(options):
        c = LMConfig.from_file(path)  # K and V, at most 4 bytes a value
        per_token = kv_bytes_per_token(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, 4)
    return common_kv_pool_bytes(options, per_token, device, free_bytes)


def lm_component(
    path: Path,
    kv_options: Mapping[str, Any],
    vocab_ranges: Sequence[tuple[int, int]] | None = None,
) -> ComponentSpec:
    """The ``lm`` component: our CausalLM from ``path`` on the KV-cache engine, with ``kv_options``
    (``Model.kv_options()``: ``DEFAULT_KV_OPTIONS`` under the model's ``kv`` option).

    ``vocab_ranges``: the only ids the model may ever sample (``CausalLM.restrict_vocab``).
    """

    stored = tensor_bytes(path)
    options = dict(kv_options)

    def build(ctx: BuildContext) -> Any:
        # imports torch: only in the process that loads the weights
        from walkserve.models.llama.weights import load_causal_lm

        # a progress bar (on the worker's stderr) where loading takes long enough to watch
        progress = stored > PROGRESS_BAR_BYTES
        model = load_causal_lm(path, device=ctx.device, dtype=ctx.dtype or None, progress=progress)
        if vocab_ranges is not None:
            model.restrict_vocab(vocab_ranges)
        return model

    return ComponentSpec(
        name="lm",
        engine="kv",
        build=build,
        weight_bytes=stored,  # as stored: the worker loads the checkpoint's dtype unless told
        state_bytes=partial(kv_pool_bytes, path, options),
        stateful=True,
        options=options,
    )


class TextLM(Model):
    """A decoder-only text LM: completions and chat, tokens streamed to the client as text."""

    params_type = TextParams

    def __init__(self, ref: ModelRef):
        self.ref = ref
        # the architecture comes from config.json, whichever of the three family names was used
        self._config = LMConfig.from_file(checkpoint_dir(ref, "the LM")) if ref.path else None

    def graph(self) -> WalkGraph:
        return build_graph(self._config.family if self._config else self.ref.family)

    def components(self) -> dict[str, ComponentSpec]:
        path = checkpoint_dir(self.ref, "its weights")
        return {"lm": lm_component(path, self.kv_options())}

    def kv_defaults(self) -> Mapping[str, Any]:
        return DEFAULT_KV_OPTIONS

    def processor(self) -> TextLMProcessor:
        path = checkpoint_dir(self.ref, "its tokenizer")
        return TextLMProcessor(path, model_id=self.ref.options.get("model_id"), family=self.ref.family)


def build(ref: ModelRef) -> TextLM:
    """Registry factory of the ``llama``, ``qwen2`` and ``qwen3`` families."""
    return TextLM(ref)
