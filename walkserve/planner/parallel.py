"""A long search's chains scored in several processes (``walkserve plan --jobs``).

Each chain (one split of the node groups into blocks, then its replicas) is
scored on its own, so they spread over processes; the search gathers their
candidates in chain order, which gives the same list as scoring them one
after another. A process loads the model from its reference once and keeps
its own start-up checker, so only the split goes in and the candidates come
back. Processes are spawned (nothing of this one's threads or of torch's
thread pools is forked), which costs each a few seconds of imports: worth it
for searches of many chains (eight GPUs: hundreds of placements, each a
simulated run of the workload), not for two CPU ranks.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from walkserve.models.base import Model
    from walkserve.planner.costs import CostTable
    from walkserve.planner.devices import Device

_search: Any = None  # this process's search, when it is one of the pool's


def in_processes(model: Model, devices: list[Device], table: CostTable, load: Any, scorer: str,
                 chains: list[list[int]], jobs: int) -> Iterator[tuple[list, list[str]]]:
    """Each chain's (candidates, rejections), in the order of ``chains``, from ``jobs`` processes."""
    pool = ProcessPoolExecutor(min(jobs, len(chains)), mp_context=multiprocessing.get_context("spawn"),
                               initializer=_start, initargs=(model.ref, devices, table, load, scorer))
    try:
        yield from pool.map(_chain, chains, chunksize=max(1, len(chains) // (8 * jobs)))
    finally:  # the search stopped early (enough candidates, an interrupt): what was not started is dropped
        pool.shutdown(wait=True, cancel_futures=True)


def _start(ref: Any, devices: list, table: Any, load: Any, scorer: str) -> None:
    global _search
    from walkserve.models.registry import load_model
    from walkserve.planner.search import ChainSearch

    _search = ChainSearch(load_model(ref), devices, table, load, scorer)


def _chain(assign: list[int]) -> tuple[list, list[str]]:
    return _search.chain(assign)
