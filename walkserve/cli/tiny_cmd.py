"""``walkserve tiny``: write a random-weight checkpoint in the official layout (tests, demos, benchmarks)."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TinyFamily:
    """How ``walkserve tiny FAMILY`` writes one family: its presets and its writer ("module:function",
    called as ``writer(args) -> Path``), and whether ``walkserve serve`` can serve the result yet."""

    presets: tuple[str, ...]
    writer: Callable[[argparse.Namespace], Path]
    serves: bool = True
    serve_as: str | None = None  # the family ``walkserve serve`` names it by, when not its own name


def _call(target: str, *args, **kwargs) -> Path:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)(*args, **kwargs)


def _text(arch: str) -> TinyFamily:
    return TinyFamily(("tiny",), lambda a: _call("walkserve.models.llama.tiny:write_tiny", arch, a.out_dir, seed=a.seed))


FAMILIES: dict[str, TinyFamily] = {
    **{arch: _text(arch) for arch in ("llama", "qwen2", "qwen3")},
    "orpheus": TinyFamily(("tiny", "bench"), lambda a: _call(
        "walkserve.models.orpheus.tiny:write_tiny_orpheus", a.out_dir, lm=a.preset, snac=a.snac, seed=a.seed)),
    "bagel": TinyFamily(("tiny",), lambda a: _call(
        "walkserve.models.bagel.tiny:write_tiny_bagel", a.out_dir, seed=a.seed)),
    **{kind: TinyFamily(("tiny", "bench"), lambda a, kind=kind: _call(
        "walkserve.models.pi0.tiny:write_tiny_policy", kind, a.out_dir, seed=a.seed, preset=a.preset))
       for kind in ("pi0", "pi05")},
    "vjepa2": TinyFamily(("tiny",), lambda a: _call(
        "walkserve.models.vjepa2.tiny:write_tiny_vjepa2", a.out_dir, preset=a.preset, seed=a.seed)),
    "vjepa2-ac": TinyFamily(("tiny", "bench"), lambda a: _call(
        "walkserve.models.vjepa2.tiny:write_tiny_vjepa2_ac", a.out_dir, preset=a.preset, seed=a.seed),
        serve_as="vjepa2"),
    "qwen3-omni": TinyFamily(("tiny",), lambda a: _call(
        "walkserve.models.qwen3_omni.tiny:write_tiny_qwen3_omni", a.out_dir, seed=a.seed)),
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tiny",
        help=f"write a tiny random-weight checkpoint ({', '.join(FAMILIES)})",
        description="Write a random-weight checkpoint in the family's official layout. The weights are random: "
        "a model served from it produces noise, and its /v1/models card says random_weights.",
    )
    p.add_argument("family", choices=sorted(FAMILIES), help="model family")
    p.add_argument("out_dir", help="directory to write (created if missing)")
    p.add_argument("--preset", default="tiny", help="size: tiny (all families) or bench (orpheus: ~33M-parameter LM; "
                   "vjepa2-ac: 64 tokens per frame, predictor width 256 x 8 blocks; pi0, pi05: the released shapes / 8 in width, "
                   "6 layers, 224 px cameras, horizon 50)")
    p.add_argument("--snac", choices=["tiny", "full"], default="tiny", help="orpheus: SNAC codec size (full = the real shape)")
    p.add_argument("--seed", type=int, default=0, help="random seed (the same seed writes the same weights)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from walkserve.core.errors import ConfigError

    family = FAMILIES[args.family]
    if args.preset not in family.presets:
        raise ConfigError(f"family {args.family!r} has presets {', '.join(family.presets)}, not {args.preset!r}")
    out = family.writer(args)
    print(f"wrote a random-weight {args.family} checkpoint ({args.preset}) to {out}")
    if family.serves:
        print(f"serve it with: walkserve serve {family.serve_as or args.family} --model-path {out}")
    return 0
