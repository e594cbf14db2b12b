"""What a V-JEPA 2 placement holds per rank, from the checkpoint's real sizes (torch-free).

Weights are read from the safetensors headers (``encoder.*``, ``predictor.*``), never the data. The AC
predictor's KV pool holds 2 x layers x KV heads x head dim values a token, at the checkpoint's dtype
(the released predictor: 2 x 24 x 16 x 64 x 4 bytes = 192 KiB a token, 48.4 MiB a 258-token step in
float32); the pool is the engine options' ``kv_bytes`` / ``num_blocks`` (blocks of one step), else the
device default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from walkserve.core.errors import PlacementError
from walkserve.models.common.kv_sizing import has_pool_size, kv_pool_bytes
from walkserve.models.common.kv_sizing import kv_bytes_per_token as common_kv_bytes_per_token
from walkserve.models.common.memory_report import GIB, MIB, rank_budget
from walkserve.models.common.safetensors_files import DTYPE_ITEMSIZE, tensor_bytes
from walkserve.models.vjepa2.config import ACPredictorConfig
from walkserve.placement.plan import Placement

PREFIX = {"encoder": "encoder.", "predictor": "predictor."}
# components named apart from their checkpoint prefix: an HF checkpoint's predictor.* is the masked predictor
ALIASES = {"masked_predictor": "predictor"}


def weight_bytes(path: Path, component: str) -> int:
    """Bytes of a component's tensors as stored (the stateless bookkeeping components hold none)."""
    component = ALIASES.get(component, component)
    return tensor_bytes(path, prefix=PREFIX[component]) if component in PREFIX else 0


def kv_bytes_per_token(config: ACPredictorConfig, dtype: str) -> int:
    return common_kv_bytes_per_token(config.num_hidden_layers, config.num_key_value_heads, config.head_dim,
                                     DTYPE_ITEMSIZE[dtype])


def rank_lines(path: Path, placement: Placement, hosted: Mapping[int, list[str]], predictor: ACPredictorConfig | None,
               kv: Mapping, dtype: str, device_memory: Callable[[str], int | None] | None) -> list[str]:
    """One line per rank (weights per component, KV per token and step, the pool in steps); PlacementError
    naming the rank and the numbers when its budget cannot hold them."""
    lines = []
    for rank, spec in sorted(placement.ranks.items()):
        comps = hosted.get(rank, [])
        budget = rank_budget(spec, device_memory)
        weights = {c: weight_bytes(path, c) for c in comps if weight_bytes(path, c)}
        total = sum(weights.values())
        parts = " + ".join(f"{c} {b / GIB:.2f} GiB" for c, b in weights.items()) or "none"
        line = f"rank {rank} ({spec.device}{'' if budget is None else f', {budget / GIB:.2f} GiB'}): " \
               f"weights {total / GIB:.2f} GiB = {parts}"
        if predictor is not None and "predictor" in comps:
            per_token = kv_bytes_per_token(predictor, dtype)
            per_step = per_token * predictor.tokens_per_step
            step = f"{per_step / MIB:.1f} MiB" if per_step >= MIB else f"{per_step / 1024:.1f} KiB"
            line += f"; KV {per_token / 1024:.1f} KiB per token ({dtype}) = {step} per step"
            free = None if budget is None else max(0, budget - total)
            if spec.device == "cpu" or free is not None or has_pool_size(kv):
                pool = kv_pool_bytes(kv, per_token, spec.device, free)
                total += pool
                line += f", pool {pool / GIB:.2f} GiB = {pool // per_step:,} steps"
        line += f"; total {total / GIB:.2f} GiB"
        if budget is not None and total > budget:
            raise PlacementError(f"{placement.source}: V-JEPA 2 does not fit: {line}, over the budget of "
                                 f"{budget / GIB:.2f} GiB by {(total - budget) / GIB:.2f} GiB (a smaller pool: "
                                 f"kv_bytes / num_blocks; or another placement)")
        lines.append(line)
    return lines
