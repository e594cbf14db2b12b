"""The base of every composable piece of a walk."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from walkserve.graph.node import GraphNode


class Section(ABC):
    """A node or a composition of sections (Sequential, Parallel, Loop, DynamicLoop)."""

    @abstractmethod
    def nodes(self) -> Iterator[GraphNode]:
        """Every node in this section, nested ones included, in declaration order."""

    @abstractmethod
    def children(self) -> tuple[Section, ...]:
        """The directly contained sections."""
