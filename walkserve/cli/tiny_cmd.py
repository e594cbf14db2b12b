"""``walkserve tiny``: write a random-weight checkpoint in the official layout (tests, demos, benchmarks)."""

from __future__ import annotations

import argparse

TEXT_ARCHS = ("llama", "qwen2", "qwen3")
POLICY_KINDS = ("pi0", "pi05")
PRESETS = {"orpheus": ("tiny", "bench"), **{arch: ("tiny",) for arch in TEXT_ARCHS + POLICY_KINDS}}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tiny",
        help="write a tiny random-weight checkpoint (llama, qwen2, qwen3, orpheus, pi0, pi05)",
        description="Write a random-weight checkpoint in the family's official layout. The weights are random: "
        "a model served from it produces noise, and its /v1/models card says random_weights.",
    )
    p.add_argument("family", choices=sorted(PRESETS), help="model family")
    p.add_argument("out_dir", help="directory to write (created if missing)")
    p.add_argument("--preset", default="tiny", help="size: tiny (all families) or bench (orpheus: ~33M-parameter LM)")
    p.add_argument("--snac", choices=["tiny", "full"], default="tiny", help="orpheus: SNAC codec size (full = the real shape)")
    p.add_argument("--seed", type=int, default=0, help="random seed (the same seed writes the same weights)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from walkserve.core.errors import ConfigError

    if args.preset not in PRESETS[args.family]:
        raise ConfigError(f"family {args.family!r} has presets {', '.join(PRESETS[args.family])}, not {args.preset!r}")
    if args.family == "orpheus":
        from walkserve.models.orpheus.tiny import write_tiny_orpheus

        out = write_tiny_orpheus(args.out_dir, lm=args.preset, snac=args.snac, seed=args.seed)
        serve = f"walkserve serve orpheus --model-path {out}"
    elif args.family in POLICY_KINDS:
        from walkserve.models.pi0.tiny import write_tiny_policy

        out = write_tiny_policy(args.family, args.out_dir, seed=args.seed)
        serve = None  # the policies' walks and routes are not wired into ``serve`` yet
    else:
        from walkserve.models.llama.tiny import write_tiny

        out = write_tiny(args.family, args.out_dir, seed=args.seed)
        serve = f"walkserve serve {args.family} --model-path {out}"
    print(f"wrote a random-weight {args.family} checkpoint ({args.preset}) to {out}")
    if serve:
        print(f"serve it with: {serve}")
    return 0
