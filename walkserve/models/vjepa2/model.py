"""VJEPA2: the ``vjepa2`` family — a V-JEPA 2 encoder, and with a V-JEPA 2-AC checkpoint its world model.

    ModelRef(family="vjepa2", path=<checkpoint dir>, options={"model_id": ..., "kv": {...}})

The directory is an HF V-JEPA 2 checkpoint (``facebook/vjepa2-*``: the tasks
``encode`` and, when it holds ``predictor.*`` tensors, ``predict``) or one
written by ``walkserve convert vjepa2-ac`` (``model_type`` ``vjepa2-ac``:
``encode``, ``rollout`` and ``plan``); config.json says which. Components:
``encoder`` (stateless); for an HF checkpoint ``masked_predictor``
(stateless); for the AC model ``predictor`` (the KV engine; one block per
step: ``block_size`` = 2 + F tokens, so a fork shares whole steps and never
copies one), ``stepper`` and ``planner`` (stateless, no weights). Options:
``model_id``, ``kv`` (KVCacheEngine options over the defaults below),
``encoder_max_batch``, ``predict`` (false: serve an HF checkpoint's encoder
only; set by ``for_placement`` when the placement does not place the masked
predictor). Importing this module imports no torch.
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
from walkserve.models.common.config_files import checkpoint_dir
from walkserve.models.common.kv_sizing import kv_pool_bytes
from walkserve.models.common.memory_report import components_per_rank
from walkserve.models.vjepa2 import memory
from walkserve.models.vjepa2.config import VJEPA2ACConfig, read_config
from walkserve.models.vjepa2.graph import build_graph
from walkserve.models.vjepa2.params import VJEPA2Run
from walkserve.models.vjepa2.processor import VJEPA2Processor
from walkserve.placement.plan import Placement

ENCODER_MAX_BATCH = 8
# one forward may hold a CEM step of many candidates (K x 258 rows); a rollout step is 258
MAX_BATCH_TOKENS = 16384
MASKED = "masked_predictor"




def _builder(name: str, path: Path):
    def build(ctx: BuildContext) -> Any:
        from walkserve.models.vjepa2 import components  # imports torch: only where the weights load

        builders = {"encoder": components.build_encoder, "predictor": components.build_ac_predictor,
                    "masked_predictor": components.build_masked_predictor,
                    "stepper": components.build_stepper, "planner": components.build_planner}
        return builders[name](ctx, path)

    return build


class VJEPA2(Model):
    """V-JEPA 2 video features; with the AC predictor, action-conditioned rollouts and CEM planning."""

    params_type = VJEPA2Run

    def __init__(self, ref: ModelRef):
        self.ref = ref
        self.path = checkpoint_dir(ref, "the V-JEPA 2 checkpoint") if ref.path else None
        self.config = read_config(self.path) if self.path else None
        self.ac = isinstance(self.config, VJEPA2ACConfig)
        # an HF checkpoint's masked predictor is served when the file holds it (and the placement places it)
        self.has_masked_predictor = bool(self.path and not self.ac and memory.weight_bytes(self.path, MASKED))
        self.predict = self.has_masked_predictor and ref.options.get("predict", True) is not False

    def graph(self) -> WalkGraph:
        return build_graph(self.config.predictor.frame_tokens if self.ac else None, predict=self.predict)

    def for_placement(self, placement: Mapping[str, Any]) -> Model:
        """A placement without the masked predictor serves an HF checkpoint's encoder only; one that places it
        on a checkpoint without one is refused here, saying so."""
        placed = {n for entry in placement.get("nodes") or () for n in entry.get("nodes") or ()}
        if MASKED in placed and not self.has_masked_predictor:
            what = "a V-JEPA 2-AC checkpoint" if self.ac else "it has no predictor.* tensors"
            raise ConfigError(f"{self.path}: the placement places the masked predictor, but this checkpoint has "
                              f"none ({what}); place only the encoder nodes (or give no placement)")
        if not self.predict or MASKED in placed:
            return self
        return VJEPA2(dataclasses.replace(self.ref, options={**self.ref.options, "predict": False}))

    def components(self) -> dict[str, ComponentSpec]:
        path = checkpoint_dir(self.ref, "its weights")
        options = self.ref.options
        out = {"encoder": ComponentSpec("encoder", "stateless", _builder("encoder", path),
                                        weight_bytes=memory.weight_bytes(path, "encoder"),
                                        options={"max_batch": int(options.get("encoder_max_batch", ENCODER_MAX_BATCH))})}
        if self.predict:
            out[MASKED] = ComponentSpec(MASKED, "stateless", _builder(MASKED, path),
                                        weight_bytes=memory.weight_bytes(path, MASKED),
                                        options={"max_batch": int(options.get("encoder_max_batch", ENCODER_MAX_BATCH))})
        if not self.ac:
            return out
        kv = self.kv_options()
        per_token = memory.kv_bytes_per_token(self.config.predictor, self.config.dtype)
        out["predictor"] = ComponentSpec("predictor", "kv", _builder("predictor", path),
                                         weight_bytes=memory.weight_bytes(path, "predictor"),
                                         state_bytes=partial(kv_pool_bytes, kv, per_token), stateful=True, options=kv)
        out["stepper"] = ComponentSpec("stepper", "stateless", _builder("stepper", path))
        out["planner"] = ComponentSpec("planner", "stateless", _builder("planner", path))
        return out

    def kv_defaults(self) -> Mapping[str, Any]:
        """The predictor's: a block per step, room for a CEM step in one forward."""
        assert isinstance(self.config, VJEPA2ACConfig)
        return {"block_size": self.config.predictor.tokens_per_step, "max_batch_tokens": MAX_BATCH_TOKENS}

    def memory_report(self, placement: Placement, device_memory: Callable[[str], int | None] | None = None) -> list[str]:
        """Per rank: the weights as stored, KV per token and step, the pool in steps; PlacementError when a rank
        cannot hold them."""
        path = checkpoint_dir(self.ref, "its weights")
        hosted = components_per_rank(self.graph(), placement)
        dtype = getattr(self.config, "dtype", "float32")
        stored = sum(memory.weight_bytes(path, c) for c in memory.PREFIX)
        head = f"checkpoint {path.name}: {stored / memory.GIB:.2f} GiB as stored ({dtype})"
        kv = self.kv_options() if self.ac else {}
        return [head, *memory.rank_lines(path, placement, hosted, self.config.predictor if self.ac else None, kv,
                                         dtype, device_memory)]

    def processor(self) -> VJEPA2Processor:
        path = checkpoint_dir(self.ref, "its config")
        model_id = self.ref.options.get("model_id") or path.name
        return VJEPA2Processor(self.config, model_id, predict=self.predict)


def build(ref: ModelRef) -> VJEPA2:
    """Registry factory of the ``vjepa2`` family."""
    return VJEPA2(ref)
