"""BagelModel: the ``bagel`` family — ``ByteDance-Seed/BAGEL-7B-MoT`` served as released.

    ModelRef(family="bagel", path=<checkpoint dir>, options={"model_id": ..., "kv": {...}, "side_dtype": ...})

Components (``components.py``): ``lm`` on the KV-cache engine (one pool per
rank; a request's gen, cfg_text and cfg_img are named contexts in it), the
ViT, the VAE encoder and decoder and the latent embedder on the stateless
engine. The walks and the state machine are in ``graph.py`` and
``machine.py``; the memory the placement check counts is in ``memory.py``.
Options: ``cfg_parallel`` (the walks write cfg_text by its own node instead of forking it from gen, so
each context can live on its own rank; set for a placement that splits the contexts, see
``for_placement``), ``kv`` (KVCacheEngine options over BAGEL's defaults: 16-token
blocks, ``max_batch_tokens`` = three 4,098-row queries), ``side_dtype``
(float32 by default: the ViT, VAE and latent embedder), ``stateless_max_batch``.
Importing this module imports no torch.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import cached_property, partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from walkserve.core.errors import ConfigError
from walkserve.engines.spec import BuildContext, ComponentSpec
from walkserve.graph.walk import WalkGraph
from walkserve.models.bagel.config import CONFIG_FILE, EMA_FILE, LLM_CONFIG_FILE, BagelConfig
from walkserve.models.bagel.graph import IMAGE_GEN, PASS_NODES, build_graph
from walkserve.models.bagel.layout import SpecialTokens
from walkserve.models.bagel.machine import BagelMachine
from walkserve.models.bagel.memory import (
    default_max_batch_tokens,
    describe,
    lm_state_bytes,
    weight_bytes,
)
from walkserve.models.bagel.params import BagelRun
from walkserve.models.bagel.processor import BagelProcessor
from walkserve.models.base import Model, ModelRef
from walkserve.models.common.memory_report import components_per_rank

if TYPE_CHECKING:
    from walkserve.placement.plan import Placement

STATELESS = ("vit", "vae_encoder", "latents", "vae_decoder")
STATELESS_MAX_BATCH = 16


def is_bagel_dir(path: str | Path) -> bool:
    """A directory in BAGEL's released layout (ema.safetensors and llm_config.json beside config.json)."""
    root = Path(path)
    return (root / EMA_FILE).is_file() and (root / LLM_CONFIG_FILE).is_file()


def special_tokens(path: Path) -> SpecialTokens:
    """The four ids the layout places, read from tokenizer.json's added tokens (no tokenizer library)."""
    try:
        added = json.loads((path / "tokenizer.json").read_text()).get("added_tokens", [])
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: cannot read tokenizer.json ({e})") from None
    ids = {a.get("content"): a.get("id") for a in added if isinstance(a, dict)}
    return SpecialTokens.from_tokenizer(_Lookup(ids))


class _Lookup:
    def __init__(self, ids: Mapping[str, int]):
        self.ids = ids

    def token_id(self, text: str) -> int | None:
        return self.ids.get(text)


class BagelModel(Model):
    params_type = BagelRun

    def __init__(self, ref: ModelRef):
        self.ref = ref
        if ref.path and not is_bagel_dir(ref.path):
            raise ConfigError(f"{ref.path}: not a BAGEL checkpoint (it needs {EMA_FILE}, {LLM_CONFIG_FILE} and "
                              f"{CONFIG_FILE}, as ByteDance-Seed/BAGEL-7B-MoT is released)")

    @property
    def path(self) -> Path:
        if not self.ref.path:
            raise ConfigError("model family 'bagel' needs its checkpoint directory (--model-path)")
        return Path(self.ref.path)

    @cached_property
    def tokens(self) -> SpecialTokens:
        return special_tokens(self.path)

    def graph(self) -> WalkGraph:
        return build_graph(BagelMachine(self.tokens), cfg_parallel=bool(self.ref.options.get("cfg_parallel")))

    def for_placement(self, placement: Mapping[str, Any]) -> BagelModel:
        """With ``cfg_parallel`` unset, turn it on for a placement that runs a guidance context's passes on other
        ranks than gen's (``bagel-cfg-parallel``): each context is then written where it is read."""
        if "cfg_parallel" in self.ref.options or not contexts_apart(placement):
            return self
        return BagelModel(replace(self.ref, options={**self.ref.options, "cfg_parallel": True}))

    def memory_report(self, placement: Placement, device_memory: Callable[[str], int | None] | None = None) -> list[str]:
        """The release's sizes from the file headers, per rank what it loads (the placement check sizes the pool)."""
        components = components_per_rank(self.graph(), placement)
        hosted = {rank: (spec.device, components[rank]) for rank, spec in placement.ranks.items()}
        return describe(self.path, hosted)

    def kv_defaults(self) -> Mapping[str, Any]:
        return {"block_size": 16, "max_batch_tokens": default_max_batch_tokens(BagelConfig.from_dir(self.path))}

    def components(self) -> dict[str, ComponentSpec]:
        path, side = self.path, str(self.ref.options.get("side_dtype", "float32"))
        sizes = weight_bytes(path)
        kv = self.kv_options()
        specs = {"lm": ComponentSpec("lm", "kv", partial(_build, "lm", path), weight_bytes=sizes["lm"],
                                     state_bytes=partial(lm_state_bytes, path, kv), stateful=True, options=kv)}
        batch = {"max_batch": int(self.ref.options.get("stateless_max_batch", STATELESS_MAX_BATCH))}
        for name in STATELESS:
            specs[name] = ComponentSpec(name, "stateless", partial(_build, name, path, side_dtype=side),
                                        weight_bytes=sizes[name], options=batch)
        return specs

    def processor(self) -> BagelProcessor:
        return BagelProcessor(self.path, model_id=self.ref.options.get("model_id"))


def contexts_apart(placement: Mapping[str, Any]) -> bool:
    """Whether the flow's passes over cfg_text or cfg_img run on other ranks than those over gen."""
    from walkserve.placement.plan import parse_placement

    parsed = parse_placement(placement, "<placement>")
    ranks = {node: parsed.ranks_for(IMAGE_GEN, node) for node in PASS_NODES.values()}
    return len(set(ranks.values())) > 1


def _build(component: str, path: Path, ctx: BuildContext, **kwargs: Any) -> Any:
    """Import the torch side only in the worker that builds the component."""
    from walkserve.models.bagel.components import BUILDERS

    return BUILDERS[component](ctx, path, **kwargs)


def build(ref: ModelRef) -> BagelModel:
    """Registry factory of the ``bagel`` family."""
    return BagelModel(ref)
