"""What a model family provides to the runtime (torch-free at import time).

A Model is built in every process from a ModelRef (family name, checkpoint
path, options): the conductor reads its graph and state machine, each worker
builds only the components placed on its rank, the API server uses its
processor (tokenizer, prompt format, media conversion).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from walkserve.core.params import Params
from walkserve.engines.spec import ComponentSpec
from walkserve.graph.walk import WalkGraph

if TYPE_CHECKING:
    from walkserve.models.processor import Processor
    from walkserve.placement.plan import Placement


@dataclass(frozen=True)
class ModelRef:
    """How to build a model anywhere: registry family, checkpoint directory, options. Crosses processes."""

    family: str
    path: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)


class Model(ABC):
    """A model family instance: graph, components, processor, default placement."""

    ref: ModelRef
    # The family's request params (a ``Params`` struct, torch-free): what ``RequestSpec.params`` holds for this
    # model. Naming it here also imports it in every process that builds the model, so the codec can decode it.
    params_type: type[Params] = Params

    @abstractmethod
    def graph(self) -> WalkGraph:
        """The walks and the state machine (pure; cheap to build)."""

    @abstractmethod
    def components(self) -> dict[str, ComponentSpec]:
        """Every component the graph's nodes name, by component name."""

    def kv_defaults(self) -> Mapping[str, Any]:
        """The family's own options for its KV-cache components (block size, tokens per forward ...); none by
        default."""
        return {}

    def kv_options(self) -> dict[str, Any]:
        """The options of this model's KV-cache components: ``kv_defaults()`` under the ``kv`` model option
        (``ModelRef.options["kv"]``); the runtime's engine options still override both in the worker."""
        return {**self.kv_defaults(), **dict(self.ref.options.get("kv") or {})}

    def processor(self) -> Processor | None:
        """The frontend's request/response converter. The default takes raw inputs on ``/v1/generate``."""
        from walkserve.models.processor import TensorProcessor

        return TensorProcessor(self.ref.family, self.ref.family, self.params_type)

    def memory_report(self, placement: Placement, device_memory: Callable[[str], int | None] | None = None) -> list[str]:
        """Lines saying what each rank of ``placement`` will hold (``walkserve serve`` prints them), from the
        checkpoint's real sizes; raises PlacementError, with those numbers, when a rank cannot hold its share.
        ``device_memory(device)``: a GPU's memory, where it can be read. The default says nothing (the generic
        check of ``placement.resolve`` still runs)."""
        return []

    def for_placement(self, placement: Mapping[str, Any]) -> Model:
        """The model to serve ``placement`` (a mapping of the placement file's schema). A family whose walks
        depend on where its nodes run returns a copy whose ``ref.options`` say so (the conductor and the
        workers rebuild the model from those options); the default serves every placement as it is."""
        return self

    def default_placement(self) -> dict:
        """A placement (same schema as the YAML file) used when none is given: all nodes on rank 0."""
        names = self.graph().node_names()
        return {"ranks": [{"id": 0, "device": "cpu"}], "nodes": [{"nodes": names, "ranks": [0]}]}
