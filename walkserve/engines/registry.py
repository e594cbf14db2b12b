"""Engine kinds by name; heavy ones (the KV engine, CUDA backends) are imported only when used."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from walkserve.core.errors import ConfigError
from walkserve.core.options import engine_options
from walkserve.engines.base import Engine
from walkserve.engines.spec import BuildContext, ComponentSpec

KINDS = ("stateless", "null", "kv")


def build_engines(specs: list[ComponentSpec], ctx: BuildContext,
                  overrides: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Engine]:
    """The engines of a rank's components, by component name; a KV share group gets one engine, under each name."""
    overrides = overrides or {}
    engines: dict[str, Engine] = {}
    groups: dict[str, list[ComponentSpec]] = {}
    for spec in specs:
        if spec.engine == "kv" and spec.kv_share:
            groups.setdefault(spec.kv_share, []).append(spec)
        else:
            engines[spec.name] = build_engine(spec, ctx, overrides.get(spec.engine))
    for members in groups.values():
        first, rest = members[0], members[1:]
        shared = {m.name: m.build(ctx) for m in rest}
        engine = build_engine(first, ctx, overrides.get("kv"), shared=shared)
        for m in members:
            engines[m.name] = engine
    return engines


def build_engine(spec: ComponentSpec, ctx: BuildContext, overrides: Mapping[str, Any] | None = None,
                 shared: Mapping[str, Any] | None = None) -> Engine:
    """Build the engine for one component on one rank, its module included."""
    if spec.engine not in KINDS:
        raise ConfigError(f"component {spec.name!r}: unknown engine kind {spec.engine!r} (known: {', '.join(KINDS)})")
    options = engine_options(spec.engine, spec.name, spec.options, overrides)
    if spec.engine == "stateless":
        from walkserve.engines.stateless import StatelessEngine

        return StatelessEngine(spec.name, spec.build(ctx), max_batch=options.max_batch)
    if spec.engine == "null":
        from walkserve.engines.null import NullEngine

        return NullEngine(spec.name, dict(options.outputs))
    if spec.engine == "kv":
        from walkserve.engines.kv.engine import KVCacheEngine

        return KVCacheEngine(spec.name, spec.build(ctx), ctx.device, ctx.dtype, options, shared=shared)
    raise ConfigError(f"component {spec.name!r}: unknown engine kind {spec.engine!r} (known: {', '.join(KINDS)})")
