"""``walkserve graph``: print a model's walks as Mermaid or DOT."""

from __future__ import annotations

import argparse
import importlib

from walkserve.core.errors import ConfigError
from walkserve.graph.render import to_dot, to_mermaid
from walkserve.graph.walk import WalkGraph
from walkserve.models.base import Model, ModelRef


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("graph", help="print a model's walk graph as Mermaid or DOT text")
    p.add_argument("model", help="a model family (e.g. orpheus, llama, fixture-omni) or 'module:factory'")
    p.add_argument("--model-path", help="checkpoint directory, for families that need one to build")
    p.add_argument("--format", choices=["mermaid", "dot"], default="mermaid")
    p.add_argument("--walk", action="append", help="only this walk (repeatable)")
    p.set_defaults(func=run)


def resolve_graph(target: str, path: str | None) -> WalkGraph:
    from walkserve.models.registry import families, load_model

    if ":" in target and target not in families():
        module, _, attr = target.partition(":")
        try:
            obj = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ConfigError(f"cannot import {target}: {e}") from None
        obj = obj(ModelRef(target, path)) if callable(obj) and not isinstance(obj, WalkGraph) else obj
    else:
        obj = load_model(ModelRef(target, path))
    if isinstance(obj, Model):
        return obj.graph()
    if isinstance(obj, WalkGraph):
        return obj
    raise ConfigError(f"{target} is neither a Model nor a WalkGraph")


def run(args: argparse.Namespace) -> int:
    graph = resolve_graph(args.model, args.model_path)
    if args.walk:
        for w in args.walk:
            graph.walk(w)
    text = to_dot(graph, args.walk) if args.format == "dot" else to_mermaid(graph, args.walk)
    print(text, end="")
    return 0
