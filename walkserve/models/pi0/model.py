"""RobotPolicy: the ``pi0`` and ``pi05`` families — lerobot's pi0 / pi0.5 checkpoints served as action policies.

    ModelRef(family="pi05", path=<lerobot checkpoint dir>, options={"tokenizer_path": <paligemma_tokenizer.model>})

The checkpoint's ``config.json`` says which model it is (``"type"``: pi0 or
pi05) and its variant (horizon, action dims, cameras, state input); naming
the other family is an error. Options: ``tokenizer_path`` (PaliGemma's
SentencePiece model; default ``tokenizer.model`` in the checkpoint, which only
tiny checkpoints ship), ``model_id``, ``kv`` (KVCacheEngine options of the
shared VLM/expert pool), ``max_batch`` (stateless batches, default 64),
``image_cache`` (camera images whose SigLIP features the vision component
keeps, default 32; 0: none).
Importing this module imports no torch.

Components (``graph.py`` has the walks):

    vision     stateless   SigLIP + projector: the request's cameras -> image tokens
    lm         KV cache    PaliGemma: writes the request's "prefix" context       ┐ one KV share group:
    expert     KV cache    the action expert: queries "prefix" (pi0: writes its   ┘ one engine, one pool
                           state token into it first)
    flow_head  stateless   action tokens in, velocity out, the Euler update, unnormalisation
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

from walkserve.core.errors import ConfigError
from walkserve.engines.spec import BuildContext, ComponentSpec
from walkserve.graph.walk import WalkGraph
from walkserve.models.base import Model, ModelRef
from walkserve.models.common.kv_sizing import kv_pool_bytes
from walkserve.models.pi0.config import KINDS, PolicyConfig
from walkserve.models.pi0.graph import EXPERT, FLOW_HEAD, LM, VISION, build_graph
from walkserve.models.pi0.processor import PolicyParams, PolicyProcessor
from walkserve.models.pi0.sizes import component_bytes, kv_bytes_per_token

KV_SHARE = "paligemma"  # the VLM and the expert: one pool, the expert reads the VLM's layer-l K/V at its layer l
DEFAULT_KV_OPTIONS: Mapping[str, Any] = {"block_size": 16}
DEFAULT_MAX_BATCH = 64
DEFAULT_IMAGE_CACHE = 32  # SigLIP features of ~32 recent camera images (~1 MiB each at gemma_2b's width in bf16)


def _build(part: str, path: Path, image_cache: int, ctx: BuildContext) -> Any:
    from walkserve.models.pi0.components import (
        build_component,  # imports torch: only where weights load
    )

    return build_component(part, path, ctx.device, ctx.dtype or None, image_cache)


class RobotPolicy(Model):
    """A vision-language-action policy: cameras, state and a task prompt in, an action chunk out."""

    params_type = PolicyParams

    def __init__(self, ref: ModelRef):
        self.ref = ref
        if not ref.path:
            raise ConfigError(f"model family {ref.family!r} needs the lerobot checkpoint directory (--model-path)")
        self.path = Path(ref.path)
        self.config = PolicyConfig.from_file(self.path)
        if ref.family in KINDS and ref.family != self.config.kind:
            raise ConfigError(f"{self.path} holds a {self.config.kind} checkpoint (config.json \"type\"), "
                              f"not {ref.family}: serve it as {self.config.kind}")

    def graph(self) -> WalkGraph:
        return build_graph(self.config.kind, self.config.num_inference_steps)

    def kv_defaults(self) -> Mapping[str, Any]:
        return DEFAULT_KV_OPTIONS

    def components(self) -> dict[str, ComponentSpec]:
        options = self.ref.options
        dtype = options.get("dtype")
        sizes = component_bytes(self.path, dtype)
        kv = self.kv_options()
        batch = {"max_batch": int(options.get("max_batch", DEFAULT_MAX_BATCH))}
        image_cache = int(options.get("image_cache", DEFAULT_IMAGE_CACHE))

        def spec(name: str, engine: str, **fields: Any) -> ComponentSpec:
            return ComponentSpec(name, engine, partial(_build, name, self.path, image_cache), weight_bytes=sizes[name],
                                 **fields)

        return {
            VISION: spec(VISION, "stateless", options=batch),
            LM: spec(LM, "kv", stateful=True, options=kv, kv_share=KV_SHARE,
                     state_bytes=partial(kv_pool_bytes, kv, kv_bytes_per_token(self.config))),
            EXPERT: spec(EXPERT, "kv", stateful=True, options=kv, kv_share=KV_SHARE),  # its pool is the lm's
            FLOW_HEAD: spec(FLOW_HEAD, "stateless", options=batch),
        }

    def processor(self) -> PolicyProcessor:
        return PolicyProcessor(self.path, self.ref.options.get("tokenizer_path"), self.ref.options.get("model_id"))


def build(ref: ModelRef) -> RobotPolicy:
    """Registry factory of the ``pi0`` and ``pi05`` families."""
    return RobotPolicy(ref)
