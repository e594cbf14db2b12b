"""``python -m benchmarks NAME [options]`` — run one benchmark and print its report."""

from __future__ import annotations

import importlib
import os
import sys

BENCHMARKS = {
    "runtime": "benchmarks.runtime",
    "lm": "benchmarks.lm",
    "lm-step": "benchmarks.lm_step",
    "tts": "benchmarks.tts",
    "vjepa": "benchmarks.vjepa",
    "vjepa-offline": "benchmarks.vjepa_offline",
    "moe": "benchmarks.moe",
    "omni-thinker": "benchmarks.omni_thinker",
    "omni-turns": "benchmarks.omni_turns",
    "omni": "benchmarks.omni_speech",
    "pi": "benchmarks.pi",
    "bagel": "benchmarks.bagel",
    "plan": "benchmarks.plan",
    "realtime": "benchmarks.realtime",
    "prompt-stall": "benchmarks.prompt_stall",
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in BENCHMARKS:
        print("usage: ./dev bench {" + ",".join(BENCHMARKS) + "} [options]   (each takes --help)")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    # In-process cases (a bare engine loop, transformers) wait between OpenMP regions as a served worker
    # does (RuntimeConfig.worker_spin): OpenMP reads its environment once, when torch loads it.
    from walkserve.core.config import RuntimeConfig

    os.environ.update(RuntimeConfig().worker_environ())
    module = importlib.import_module(BENCHMARKS[argv[0]])
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
