"""Worker process entry: ``python -m walkserve.worker.main SPEC_FILE RANK PARENT_PID``.

``python -m walkserve.worker.main - PARENT_PID`` reads a msgpack ``RankLaunch``
(spec, rank, site) from stdin instead: how a Ray actor on another
node starts its rank, with no spec file on that node.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import traceback

from walkserve.core.proc import die_with_parent, name_thread, set_title, setup_logging, usable_cores
from walkserve.protocol.run import RankLaunch, RankSite, RunSpec, load_run_spec

log = logging.getLogger("walkserve.worker")
EXECUTOR_THREAD = "executor"  # the heartbeat's thread, by this name in /proc/PID/task/TID/comm too


def _threads(spec: RunSpec, device: str) -> int:
    if spec.config.worker_threads > 0:
        return spec.config.worker_threads
    n_ranks = max(1, len(spec.placement.get("ranks", [])))
    return max(1, usable_cores() // n_ranks) if device == "cpu" else 1


def _omp_wait() -> str:
    """The OpenMP wait settings this process started with (RuntimeConfig.worker_spin puts GOMP_SPINCOUNT there)."""
    found = [f"{k}={os.environ[k]}" for k in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY") if k in os.environ]
    return ", ".join(found) or "default"


def main(argv: list[str]) -> int:
    if argv[1] == "-":
        import msgspec

        launch = msgspec.msgpack.decode(sys.stdin.buffer.read(), type=RankLaunch)
        worker_main(launch.spec, launch.rank, int(argv[2]), launch.site)
    else:
        worker_main(load_run_spec(argv[1]), int(argv[2]), int(argv[3]))
    # The worker closed its sockets and stopped its threads; skip the interpreter's teardown of
    # torch and the model (seconds), as a forked worker does (zygote.py).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def local_site(spec: RunSpec, rank: int) -> RankSite:
    """A rank on this host: an IPC inbox in the run directory, or 127.0.0.1 for a TCP rank.

    IPC ranks share one node (shared memory between them); a TCP rank is a
    node of its own, as a rank on another host would be (tensors inline).
    """
    from walkserve.placement.plan import parse_placement

    if parse_placement(spec.placement, spec.placement_source).ranks[rank].transport == "tcp":
        return RankSite("tcp://127.0.0.1:0", spec.conductor_address, f"local/rank{rank}", "127.0.0.1")
    return RankSite(spec.address(f"rank{rank}"), spec.conductor_address, "local", "127.0.0.1")


def worker_main(spec: RunSpec, rank: int, parent_pid: int, site: RankSite | None = None) -> None:
    """Runs in the child process."""
    set_title(f"walkserve: worker rank {rank} ({spec.model_family})")
    die_with_parent(parent_pid)
    setup_logging(f"rank{rank}")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the conductor decides when workers stop
    site = site or local_site(spec, rank)
    try:
        worker = build_worker(spec, rank, site)
    except Exception as e:
        _report_start_failure(site, spec, rank, e)
        raise SystemExit(3) from None
    _run_on_thread(worker)


def _run_on_thread(worker) -> None:
    """The heartbeat and its engines on a thread of their own, not on the process's main thread: with
    two OpenMP threads on a loaded machine, the same steps ran 3-20x slower driven from the main
    thread (a 561-token speech stream: 96-125 s against 4-7 s at load 6; ./dev bench lm's bare loop
    at 2 threads: 20 against 127 tokens/s). The cause was OpenMP's spin: with one thread pool in the
    process libgomp busy-waits ~6 ms after each parallel region, with two (the main thread's, from
    loading, and this one's) only 100 iterations; RuntimeConfig.worker_spin now sets it either way.
    The thread keeps the CUDA device ``build_worker`` chose (the current device is per thread)."""
    import torch

    device = torch.cuda.current_device() if torch.cuda.is_initialized() else None

    def run() -> None:
        name_thread(EXECUTOR_THREAD)
        if device is not None:
            torch.cuda.set_device(device)
        worker.run()

    runner = threading.Thread(target=run, name=EXECUTOR_THREAD)
    runner.start()
    runner.join()


def build_worker(spec: RunSpec, rank: int, site: RankSite):
    import torch

    import walkserve.models.builtin  # noqa: F401  (model families)
    from walkserve.engines.registry import build_engines
    from walkserve.engines.spec import BuildContext
    from walkserve.models.base import ModelRef
    from walkserve.models.registry import load_model
    from walkserve.placement.plan import parse_placement
    from walkserve.worker.worker import Worker

    placement = parse_placement(spec.placement, spec.placement_source)
    device = site.device or placement.ranks[rank].device
    torch.set_num_threads(_threads(spec, device))
    log.info("rank %d on %s: %d torch threads, OpenMP wait %s", rank, device, torch.get_num_threads(), _omp_wait())
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device if ":" in device else "cuda:0"))
    model = load_model(ModelRef(spec.model_family, spec.model_path, spec.model_options))
    graph = model.graph()
    walks = {w: [n.name for n in walk.nodes()] for w, walk in graph.walks.items()}
    hosted = {graph.plans[w].nodes[n].component for w, n in placement.nodes_on(rank, walks)}
    ctx = BuildContext(rank=rank, device=device, dtype=spec.config.dtype or "")
    components = model.components()
    engines = build_engines([components[name] for name in sorted(hosted)], ctx, spec.config.engine_options)
    for name in sorted(hosted):
        log.info("rank %d built component %s (%s engine) on %s", rank, name, components[name].engine, device)
    return Worker(spec, rank, graph, engines, site, placement)


def _report_start_failure(site: RankSite, spec: RunSpec, rank: int, e: Exception) -> None:
    """Tell the conductor why this rank could not start, then exit."""
    import zmq

    from walkserve.protocol import messages as m
    from walkserve.transport.ipc import Outbox

    log.error("rank %d failed to start: %s\n%s", rank, e, traceback.format_exc())
    ctx = zmq.Context()
    out = Outbox(ctx, spec.token)
    out.connect("conductor", site.conductor)
    out.send_now("conductor", m.RankFailed(rank, f"rank {rank} could not start: {type(e).__name__}: {e}"))
    out.close(
        linger_ms=2000
    )  # closing at once would drop the report before it reaches the conductor
    ctx.term()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
