"""``python -m walkserve.api --engine module:factory [--engine-option key=value ...] [server flags]``.

Serves any EngineClient a factory returns, e.g. the fake engine for tests:
``python -m walkserve.api --engine walkserve.testing.fake_engine:build_fake_engine --engine-option audio=true``.
Option values are parsed as JSON when they can be (``true``, ``3``, ``["a","b"]``), else kept as strings.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys

from walkserve.api.config import ServerConfig
from walkserve.api.server import serve
from walkserve.core import env


def _option(text: str) -> tuple[str, object]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    try:
        return key, json.loads(raw)
    except json.JSONDecodeError:
        return key, raw


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m walkserve.api", description=__doc__.split("\n")[0])
    p.add_argument("--engine", required=True, help="module:factory returning an EngineClient")
    p.add_argument("--engine-option", action="append", type=_option, default=[], metavar="KEY=VALUE")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=env.WALKSERVE_API_KEY.get(), help="Bearer key (default: $WALKSERVE_API_KEY)")
    p.add_argument("--max-body-bytes", type=int, default=ServerConfig.max_body_bytes)
    p.add_argument("--max-n", type=int, default=ServerConfig.max_n)
    p.add_argument("--drain-timeout", type=float, default=ServerConfig.drain_timeout_s)
    p.add_argument("--media-allowlist", action="append", default=[], metavar="URL_PREFIX")
    p.add_argument("--model-alias", action="append", default=[])
    p.add_argument("--log-level", default="info")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    module, _, attr = args.engine.partition(":")
    factory = getattr(importlib.import_module(module), attr)
    engine = factory(**dict(args.engine_option))
    config = ServerConfig(
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        max_body_bytes=args.max_body_bytes,
        max_n=args.max_n,
        drain_timeout_s=args.drain_timeout,
        media_allowlist=tuple(args.media_allowlist),
        model_aliases=tuple(args.model_alias),
        log_level=args.log_level,
    )
    serve(engine, config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
