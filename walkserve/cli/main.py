"""``walkserve``: serve, graph, tiny, convert, env, plan, profile."""

from __future__ import annotations

import argparse
import sys

import walkserve
from walkserve.core.errors import WalkserveError


def _register_builtin_families() -> None:
    import walkserve.models.builtin  # noqa: F401  (registers model families)


def build_parser() -> argparse.ArgumentParser:
    from walkserve.cli import env_cmd, graph_cmd

    parser = argparse.ArgumentParser(prog="walkserve", description="Serve composite multimodal models.")
    parser.add_argument("--version", action="version", version=f"walkserve {walkserve.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    graph_cmd.add_parser(sub)
    env_cmd.add_parser(sub)
    for module in ("serve_cmd", "tiny_cmd", "convert_cmd", "plan_cmd"):
        try:
            mod = __import__(f"walkserve.cli.{module}", fromlist=["add_parser"])
        except ImportError:
            continue
        mod.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    _register_builtin_families()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except WalkserveError as e:
        print(f"walkserve: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
