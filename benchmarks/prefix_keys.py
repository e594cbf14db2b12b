"""``python benchmarks/prefix_keys.py``: what keying the prefix cache costs per prompt, on the bookkeeping alone.

A 2,000-row prompt at block size 16 (125 blocks) in a fresh ``BlockManager``:

    commit   append_slots + commit of the whole prompt: every full block's key computed and registered
    attach   attach_prefix of an equal prompt (all but its last row): every block's key computed and found

for token ids (the common case) and for a content-keyed prompt whose second half is media rows keyed
``(token, digest lo, digest hi, positions)`` (a Qwen3-Omni image's: a 128-bit digest in two ints; "media 1 int"
is the same with a one-int digest, the form before 128-bit media keys); and the capture cache's keys of a 2,000-row history's
runs (``capture_cache._run_keys``: 1,000 media rows in runs of 32). Median microseconds over ``--repeats``.
It imports only those two modules, so another checkout's figures come from the same script:
``PYTHONPATH=/that/checkout python benchmarks/prefix_keys.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from walkserve.engines.kv.block_manager import BlockManager
from walkserve.engines.kv.capture_cache import _run_keys

ROWS, BLOCK = 2000, 16


def prompts(n: int = ROWS) -> dict[str, list[Any]]:
    text = [1000 + (i * 7919) % 150_000 for i in range(n)]
    half = n // 2
    lo, hi = (1 << 62) + 12345, -(1 << 61) - 67890
    media = [(151_655, lo, hi, (half, half + i // 40, i % 40)) for i in range(n - half)]
    narrow = [(151_655, lo, (half, half + i // 40, i % 40)) for i in range(n - half)]
    audio = [(151_646, (1 << 62) + i // 32, hi, (half + i,)) for i in range(n - half)]
    return {"token ids": text, "media rows": [*text[:half], *media], "media 1 int": [*text[:half], *narrow],
            "audio runs": [*text[:half], *audio]}


def _commit(rows: list[Any]) -> BlockManager:
    bm = BlockManager(num_blocks=len(rows) // BLOCK + 2, block_size=BLOCK)
    bm.append_slots(("a", "main"), len(rows))
    bm.commit(("a", "main"), rows, len(rows))
    return bm


def _attach(bm: BlockManager, rows: list[Any]) -> None:
    got = bm.attach_prefix(("b", "main"), rows, len(rows) - 1)
    assert got == (len(rows) - 1) // BLOCK * BLOCK, got
    bm.free(("b", "main"))


def _median_us(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=300)
    args = parser.parse_args(argv)
    cases = prompts()
    print(f"{ROWS} rows, block size {BLOCK}; median of {args.repeats}; load average {os.getloadavg()[0]:.2f}")
    for name in ("token ids", "media rows", "media 1 int"):
        rows = cases[name]
        bm = _commit(rows)
        commit = _median_us(lambda rows=rows: _commit(rows), args.repeats)
        attach = _median_us(lambda bm=bm, rows=rows: _attach(bm, rows), args.repeats)
        print(f"  {name:<11} commit {commit:8.1f} us   attach {attach:8.1f} us")
    rows = cases["audio runs"]
    runs = _median_us(lambda: _run_keys(rows, ROWS // 2, ROWS, "thinker"), args.repeats)
    print(f"  capture cache run keys ({len(_run_keys(rows, ROWS // 2, ROWS, 'thinker'))} runs) {runs:8.1f} us")


if __name__ == "__main__":
    main()
