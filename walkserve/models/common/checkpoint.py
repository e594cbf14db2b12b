"""Reading an HF safetensors checkpoint into a module (generic: any family can use it).

Layout: ``model.safetensors``, or shards listed by ``model.safetensors.index.json``
(``{"weight_map": {tensor name: shard file}}``). Tensors are read one at a time
(memory-mapped) and copied straight into the module's parameters, cast to the
parameters' dtype and device, so peak memory is the model plus one tensor.

Which checkpoint tensor fills which parameter: a module that defines
``checkpoint_parts(prefix)`` (fused projections, stacked experts) says so
itself; any other parameter reads the tensor of its own qualified name.
Missing, unexpected and mis-shaped tensors raise ConfigError naming them.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from walkserve.core.errors import ConfigError
from walkserve.models.common.safetensors_files import INDEX_FILE, ITEMSIZE, SINGLE_FILE, read_header


@dataclass(frozen=True)
class Target:
    """Where one checkpoint tensor goes: a parameter (qualified name) and the index of its slice."""

    param: str
    index: tuple[int | slice, ...] = ()


class SafetensorsCheckpoint:
    """The tensors of a checkpoint directory, by name, read lazily.

    ``single_file`` names the one-file layout's file (``model.safetensors``;
    BAGEL's ``ema.safetensors`` and ``ae.safetensors``).
    """

    def __init__(self, directory: str | Path, single_file: str = SINGLE_FILE):
        self.directory = Path(directory)
        self.single_file = single_file
        self.files = self._weight_map()  # tensor name -> shard path

    def _weight_map(self) -> dict[str, Path]:
        index = self.directory / INDEX_FILE
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ConfigError(f"{index}: not a safetensors index ({e})") from None
            return {name: self.directory / file for name, file in weight_map.items()}
        single = self.directory / self.single_file
        if not single.is_file():
            raise ConfigError(f"{self.directory}: no {self.single_file} or {INDEX_FILE}")
        from safetensors import safe_open

        with safe_open(single, framework="pt") as f:
            return dict.fromkeys(f.keys(), single)

    def names(self) -> list[str]:
        return sorted(self.files)

    def shapes(self, names: Iterable[str] | None = None) -> dict[str, tuple[tuple[int, ...], str]]:
        """name -> (shape, safetensors dtype) of ``names`` (default: all), from their files' headers only."""
        out: dict[str, tuple[tuple[int, ...], str]] = {}
        for path, group in self._by_file(self.names() if names is None else names):
            header = read_header(path)
            for name in group:
                if name not in header:
                    raise ConfigError(f"{path.name}: index lists {name!r} but the file lacks it")
                out[name] = (tuple(header[name]["shape"]), header[name]["dtype"])
        return out

    def nbytes(self, itemsize: int | None = None) -> int:
        """Total bytes of the tensors, stored size or at ``itemsize`` bytes per element."""
        total = 0
        for shape, dtype in self.shapes().values():
            total += math.prod(shape) * (itemsize or ITEMSIZE.get(dtype, 4))
        return total

    def tensors(self, names: Iterable[str], progress: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (name, tensor on CPU) shard by shard, with a progress bar on stderr."""
        from safetensors import safe_open
        from tqdm import tqdm

        names = list(names)
        bar = tqdm(total=len(names), desc=f"loading {self.directory.name}", unit="tensor", disable=not progress,
                   leave=False)
        with bar:
            for path, group in self._by_file(names):
                with safe_open(path, framework="pt", device="cpu") as f:
                    for name in group:
                        yield name, f.get_tensor(name)
                        bar.update(1)

    def _by_file(self, names: Iterable[str]) -> list[tuple[Path, list[str]]]:
        groups: dict[Path, list[str]] = {}
        for name in names:
            groups.setdefault(self.files[name], []).append(name)
        return sorted(groups.items())


def checkpoint_targets(module: nn.Module, prefix: str = "") -> dict[str, Target]:
    """checkpoint tensor name -> Target, for every parameter of ``module`` (names under ``prefix``)."""
    targets: dict[str, Target] = {}
    claimed: set[str] = set()
    for mod_name, mod in module.named_modules():
        parts = getattr(mod, "checkpoint_parts", None)
        if parts is None:
            continue
        for ckpt_name, (param, index) in parts(mod_name).items():
            qualified = f"{mod_name}.{param}" if mod_name else param
            targets[prefix + ckpt_name] = Target(qualified, index)
            claimed.add(qualified)
    for name, _ in module.named_parameters():
        if name not in claimed:
            targets[prefix + name] = Target(name)
    return targets


def expected_shapes(module: nn.Module, prefix: str = "") -> dict[str, tuple[int, ...]]:
    """checkpoint tensor name -> the shape the module expects (works on the meta device)."""
    params = dict(module.named_parameters())
    return {name: _indexed_shape(params[t.param], t.index) for name, t in checkpoint_targets(module, prefix).items()}


def _indexed_shape(param: torch.Tensor, index: tuple[int | slice, ...]) -> tuple[int, ...]:
    """``param[index].shape``, from the shape alone (no tensor op: a MoE layer's experts are thousands of
    such views, and every op on the meta device costs a dispatch)."""
    parts = index if isinstance(index, tuple) else (index,)
    if not all(isinstance(p, (int, slice)) for p in parts):
        return tuple(param[index].shape)
    shape = tuple(param.shape)
    kept = [len(range(*p.indices(shape[d]))) for d, p in enumerate(parts) if isinstance(p, slice)]
    return (*kept, *shape[len(parts):])


def load_into(
    module: nn.Module,
    checkpoint: SafetensorsCheckpoint,
    prefix: str = "",
    ignored: Iterable[str] = (),
    progress: bool = True,
) -> None:
    """Fill every parameter of ``module`` from ``checkpoint``.

    Only tensors under ``prefix`` are considered (a component of a larger
    checkpoint); of those, any that fills no parameter raises, unless listed
    in ``ignored`` (names without the prefix).
    """
    targets = checkpoint_targets(module, prefix)
    skip = {prefix + name for name in ignored}
    present = [n for n in checkpoint.names() if n.startswith(prefix) and n not in skip]
    unexpected = [n for n in present if n not in targets]
    if unexpected:
        raise ConfigError(f"{checkpoint.directory}: unexpected tensor(s) {_names(unexpected)}")
    missing = sorted(set(targets) - set(present))
    if missing:
        raise ConfigError(f"{checkpoint.directory}: missing tensor(s) {_names(missing)}")
    params = dict(module.named_parameters())
    stored = checkpoint.shapes(present)  # only the shards that hold them are opened
    for name in present:
        target = targets[name]
        want = tuple(params[target.param][target.index].shape)
        if stored[name][0] != want:
            raise ConfigError(
                f"{checkpoint.directory}: tensor {name!r} has shape {list(stored[name][0])}, "
                f"the model expects {list(want)}"
            )
    with torch.no_grad():
        for name, tensor in checkpoint.tensors(present, progress):
            target = targets[name]
            params[target.param][target.index].copy_(tensor)


@contextlib.contextmanager
def on_meta() -> Iterator[None]:
    """``torch.device("meta")`` for modules whose weights come next (from a checkpoint, or only their shapes are read).

    Their initialisers are skipped where they would only cost time: ``normal_`` on a meta tensor (an embedding's
    init) runs through torch's Python references, whose first call imports torch._dynamo, a second or more of every
    process that builds such a model (each worker's start-up). Other tensors still get the real ``normal_``.
    """
    real = torch.nn.init.normal_

    @functools.wraps(real)
    def normal_(tensor: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return tensor if tensor.is_meta else real(tensor, *args, **kwargs)

    torch.nn.init.normal_ = normal_
    try:
        with torch.device("meta"):
            yield
    finally:
        torch.nn.init.normal_ = real


def materialize(module: nn.Module, device: torch.device | str, dtype: torch.dtype) -> nn.Module:
    """Replace every (meta) parameter by uninitialised storage of ``dtype`` on ``device``, no grad."""
    for mod in module.modules():
        for name, param in list(mod.named_parameters(recurse=False)):
            fresh = torch.empty(param.shape, dtype=dtype, device=device)
            mod._parameters[name] = nn.Parameter(fresh, requires_grad=False)
    return module


def _names(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
