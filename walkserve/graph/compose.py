"""Sequential, Parallel, Loop and DynamicLoop."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence

from walkserve.core.errors import GraphError
from walkserve.graph.node import GraphNode, check_name
from walkserve.graph.section import Section
from walkserve.graph.stop import Count, StopRule, check_count

LAST = "last"
ACCUMULATE = "accumulate"
LOOP_OUTPUT_MODES = (LAST, ACCUMULATE)

_auto_names = itertools.count()


def _sections(items: Sequence[Section], kind: str) -> tuple[Section, ...]:
    out = tuple(items)
    if not out:
        raise GraphError(f"{kind}() needs at least one section")
    for s in out:
        if not isinstance(s, Section):
            raise GraphError(f"{kind}() takes sections (nodes, loops ...), got {s!r}")
    return out


class Sequential(Section):
    """A chain of sections: each may depend on the ones before it, never on the ones after."""

    def __init__(self, *sections: Section):
        self.sections = _sections(sections, "Sequential")

    def nodes(self) -> Iterator[GraphNode]:
        for s in self.sections:
            yield from s.nodes()

    def children(self) -> tuple[Section, ...]:
        return self.sections

    def __repr__(self) -> str:
        return f"Sequential{self.sections!r}"


class Parallel(Section):
    """Branches that may run concurrently. A join is a node whose inputs come from several branches."""

    def __init__(self, *branches: Section):
        self.branches = _sections(branches, "Parallel")

    def nodes(self) -> Iterator[GraphNode]:
        for s in self.branches:
            yield from s.nodes()

    def children(self) -> tuple[Section, ...]:
        return self.branches

    def __repr__(self) -> str:
        return f"Parallel{self.branches!r}"


def _normalize_carry(carry: Mapping[str, str | Sequence[str]] | None) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for src, dsts in (carry or {}).items():
        out[src] = (dsts,) if isinstance(dsts, str) else tuple(dsts)
        if not out[src]:
            raise GraphError(f"carry from {src!r} names no destination")
    return out


class Loop(Section):
    """A bounded loop over ``body``.

    ``iterations``: an int, a request parameter name, or a function of the
    request parameters. ``carry`` maps a body output to one or more body
    inputs of the next iteration (the back edge); such an input takes its
    iteration-0 value from an edge that enters the loop. Any other edge
    entering the loop is loop-invariant: the same value for every iteration.
    ``outputs`` declares, for each body output read outside the loop, whether
    downstream gets the ``"last"`` iteration's value or the ``"accumulate"``d
    concatenation of all iterations. Iteration identity is part of a firing's
    key: an output of iteration k fills slots of iteration k, or of k+1
    through a carry, never anything else.
    """

    kind = "loop"

    def __init__(
        self,
        body: Section,
        iterations: Count,
        carry: Mapping[str, str | Sequence[str]] | None = None,
        outputs: Mapping[str, str] | None = None,
        name: str | None = None,
    ):
        self.body = _sections([body], type(self).__name__)[0]
        self.name = name or f"loop{next(_auto_names)}"
        check_name("loop", self.name)
        check_count(iterations, f"loop {self.name!r} iterations")
        self.iterations = iterations
        self.carry = _normalize_carry(carry)
        self.outputs = dict(outputs or {})
        for out, mode in self.outputs.items():
            if mode not in LOOP_OUTPUT_MODES:
                raise GraphError(
                    f"loop {self.name!r}: output {out!r} has mode {mode!r}; use 'last' or 'accumulate'"
                )

    def nodes(self) -> Iterator[GraphNode]:
        yield from self.body.nodes()

    def children(self) -> tuple[Section, ...]:
        return (self.body,)

    @property
    def bound(self) -> Count:
        """The most iterations a request can run."""
        return self.iterations

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.body!r})"


class DynamicLoop(Loop):
    """A Loop that each request may leave early, when ``stop`` fires, and at most ``max_iterations``.

    The semantics allow a runtime to prepare iteration k+1 before the stop
    rule for k is known (a stop then takes effect at the next boundary,
    wasting at most one step, and the extra step's outputs are never
    exposed); ``speculate=False`` (or ``speculate=False`` on a body node)
    forbids that. walkserve's executor decides every iteration before the
    next one starts, so it never runs a step that does not count.
    """

    kind = "dynamic"

    def __init__(
        self,
        body: Section,
        stop: StopRule,
        max_iterations: Count,
        carry: Mapping[str, str | Sequence[str]] | None = None,
        outputs: Mapping[str, str] | None = None,
        name: str | None = None,
        speculate: bool = True,
    ):
        super().__init__(body, max_iterations, carry, outputs, name)
        if not isinstance(stop, StopRule):
            raise GraphError(f"dynamic loop {self.name!r}: stop must be a StopRule, got {stop!r}")
        self.stop = stop
        self.speculate = speculate

    @property
    def max_iterations(self) -> Count:
        return self.iterations
