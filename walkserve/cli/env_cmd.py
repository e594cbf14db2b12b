"""``walkserve env``: list every environment variable walkserve reads."""

from __future__ import annotations

import argparse

from walkserve.core import env


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("env", help="list the environment variables walkserve reads, with defaults")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    for knob in env.all_knobs():
        value = knob.get()
        now = "<set, hidden>" if knob.name.endswith("_KEY") and value else repr(value)  # never print a secret
        print(f"{knob.name} ({knob.kind.__name__}, default {knob.default!r}; now {now})\n    {knob.help}")
    return 0
