"""NullEngine: deterministic outputs of the declared shapes, no model. For runtime tests and overhead benchmarks.

ComponentSpec.options["outputs"] maps each output name to (dtype, shape);
values are a small hash of (request, node), so runs are reproducible; the
tensors are cached and shared (consumers must not write into inputs).
"""

from __future__ import annotations

import zlib

import torch

from walkserve.engines.base import Engine, Group, Result
from walkserve.engines.values import _NAME_TO_TORCH


class NullEngine(Engine):
    def __init__(self, component: str, outputs: dict[str, tuple[str, tuple[int, ...]]]):
        self.component = component
        self.outputs = {k: (_NAME_TO_TORCH[d], tuple(s)) for k, (d, s) in outputs.items()}
        self.steps = 0
        self._cache: dict[tuple[str, int], torch.Tensor] = {}
        self._salts: dict[tuple[str, str], int] = {}  # (request, node) -> its value; dropped on release
        self._groups: dict[tuple, dict] = {}  # (request, node, outputs) -> a group member's outputs

    def run_groups(self, groups: list[Group], may_yield: bool = False) -> list[list[Result]]:
        """One dict per member, cached per (request, node, outputs): the same every iteration."""
        self.steps += 1
        cache, results = self._groups, []
        for group in groups:
            node, outputs, out = group.node, group.outputs, []
            for rid in group.request_ids:
                values = cache.get((rid, node, outputs))
                if values is None:
                    values = cache[(rid, node, outputs)] = {o: self._salted(rid, node, o) for o in outputs}
                out.append(values)
            results.append(out)
        return results

    def _salted(self, request_id: str, node: str, output: str) -> torch.Tensor:
        salt = self._salts.get((request_id, node))
        if salt is None:
            salt = self._salts[(request_id, node)] = zlib.crc32(f"{request_id}/{node}".encode()) % 97
        value = self._cache.get((output, salt))
        if value is None:
            dtype, shape = self.outputs.get(output, (torch.int64, (1,)))
            value = self._cache[(output, salt)] = torch.full(shape, salt, dtype=dtype)
        return value

    def release(self, request_id: str) -> None:
        for key in [k for k in self._salts if k[0] == request_id]:
            del self._salts[key]
        for key in [k for k in self._groups if k[0] == request_id]:
            del self._groups[key]

    def state_count(self) -> int:
        return len({rid for rid, _ in self._salts})
