"""Conductor process entry: ``python -m walkserve.conductor.main SPEC_FILE PARENT_PID``."""

from __future__ import annotations

import logging
import signal
import sys

from walkserve.core.proc import die_with_parent, set_title, setup_logging
from walkserve.protocol.run import load_run_spec

log = logging.getLogger("walkserve.conductor")


def main(argv: list[str]) -> int:
    spec_path, parent_pid = argv[1], int(argv[2])
    spec = load_run_spec(spec_path)
    set_title(f"walkserve: conductor ({spec.model_family})")
    die_with_parent(parent_pid, use_pdeathsig=False)
    setup_logging("conductor")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the frontend decides when to stop

    import walkserve.models.builtin  # noqa: F401  (model families)
    from walkserve.conductor.conductor import Conductor
    from walkserve.models.base import ModelRef
    from walkserve.models.registry import load_model
    from walkserve.placement.plan import parse_placement

    model = load_model(ModelRef(spec.model_family, spec.model_path, spec.model_options))
    conductor = Conductor(spec, model.graph(), parse_placement(spec.placement, spec.placement_source))

    def on_term(_signum, _frame):
        conductor.stopping = True

    signal.signal(signal.SIGTERM, on_term)
    conductor.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
