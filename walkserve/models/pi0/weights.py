"""Load a pi0 / pi0.5 checkpoint's weights as lerobot releases them: config.json + model.safetensors.

The torch-free rest (tokenizer, normalisation statistics) is ``files.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from walkserve.core.errors import ConfigError
from walkserve.models.common.checkpoint import (
    SafetensorsCheckpoint,
    checkpoint_targets,
    materialize,
    on_meta,
)
from walkserve.models.common.dtypes import TORCH_DTYPES
from walkserve.models.pi0.config import PolicyConfig
from walkserve.models.pi0.policy import EMBEDDING, TIED_HEAD, UNUSED, Pi0Policy, checkpoint_name

FILE_PREFIX = "model."  # lerobot's save_pretrained prefixes every tensor with it; hub files may not


def load_policy(path: str | Path, device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None,
                progress: bool = True) -> Pi0Policy:
    """config.json + model.safetensors of ``path`` -> an eval-mode Pi0Policy on ``device``.

    ConfigError names any missing, unexpected or mis-shaped tensor.
    """
    path = Path(path)
    config = PolicyConfig.from_file(path)
    with on_meta():
        policy = Pi0Policy(config)
    materialize(policy, device, _dtype(dtype, config))
    load_policy_weights(policy, SafetensorsCheckpoint(path), progress)
    return policy.eval()


def load_policy_weights(policy: nn.Module, checkpoint: SafetensorsCheckpoint, progress: bool = True,
                        part: bool = False) -> None:
    """Every parameter of ``policy`` (a Pi0Policy, or with ``part`` a module holding some of its
    components under their names) from the checkpoint; with ``part`` the file's other tensors are skipped."""
    names = {_strip(n): n for n in checkpoint.names()}
    targets = {checkpoint_name(own): t for own, t in checkpoint_targets(policy).items()}
    if EMBEDDING in targets and EMBEDDING not in names and TIED_HEAD in names:
        targets[TIED_HEAD] = targets.pop(EMBEDDING)  # the hub file holds only the tied head
    ignored = set(UNUSED) | ({TIED_HEAD} if EMBEDDING in names else set())
    unexpected = [] if part else sorted(n for n in names if n not in targets and n not in ignored)
    missing = sorted(n for n in targets if n not in names)
    if unexpected or missing:
        raise ConfigError(f"{checkpoint.directory}: " + "; ".join(
            f"{what} tensor(s) {', '.join(repr(n) for n in group[:6])}{' ...' if len(group) > 6 else ''}"
            for what, group in (("unexpected", unexpected), ("missing", missing)) if group))
    params = dict(policy.named_parameters())
    shapes = checkpoint.shapes()
    for name, target in targets.items():
        want = tuple(params[target.param][target.index].shape)
        have = shapes[names[name]][0]
        if have != want:
            raise ConfigError(f"{checkpoint.directory}: tensor {name!r} has shape {list(have)}, the model "
                              f"expects {list(want)}")
    with torch.no_grad():
        for stored, tensor in checkpoint.tensors([names[n] for n in targets], progress):
            target = targets[_strip(stored)]
            params[target.param][target.index].copy_(tensor)


def load_component(path: str | Path, name: str, build: Callable[[PolicyConfig], nn.Module],
                   device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None,
                   progress: bool = False) -> nn.Module:
    """One component of the checkpoint: ``build(config)`` made on the meta device, loaded as if it were
    ``Pi0Policy.<name>`` (``vision``, ``lm``, ``expert``; the flow head reads the expert's root projections)."""
    path = Path(path)
    config = PolicyConfig.from_file(path)
    with on_meta():
        module = build(config)
    holder = nn.Module()
    holder.add_module(name, module)
    materialize(holder, device, _dtype(dtype, config))
    load_policy_weights(holder, SafetensorsCheckpoint(path), progress, part=True)
    return module.eval()


def _strip(name: str) -> str:
    return name[len(FILE_PREFIX):] if name.startswith(FILE_PREFIX) else name


def _dtype(dtype: str | torch.dtype | None, config: PolicyConfig) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype or config.dtype).removeprefix("torch.")
    if name not in TORCH_DTYPES:
        raise ConfigError(f"unsupported weight dtype {name!r} (supported: {', '.join(TORCH_DTYPES)})")
    return TORCH_DTYPES[name]
