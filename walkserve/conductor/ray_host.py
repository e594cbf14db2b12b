"""RankHost: the Ray actor that hosts one rank on its node.

The conductor creates one per rank, on that rank's bundle of the run's
placement group. The actor does not run the worker in its own process: it
starts it as a child (``python -m walkserve.worker.main - ACTOR_PID``), writes
the rank's ``RankLaunch`` (msgpack) to its stdin, and waits for it:

    conductor ──ray──▶ RankHost (ray::RankHost, one per rank, holds the bundle)
                          └─ walkserve: worker rank N   (the same entry a local worker runs)

So the worker is the same process on every launcher (its own signal handling,
PDEATHSIG on its parent, process title), nothing of Ray shares its process,
and its exit status reaches the conductor as an exit code or a signal, which
Ray's own death records do not carry. Its death fate-shares with the actor:
killing the actor (``ray.kill``, a lost node, the conductor gone) kills the
worker through PDEATHSIG. The actor's methods run one at a time on its main
thread (``max_concurrency=1``), the thread PDEATHSIG watches.

This module is torch-free and imports Ray only inside the methods that run
on the actor, so the conductor can name the class without starting Ray.
"""

from __future__ import annotations

import os
import subprocess
import sys

import msgspec

from walkserve.protocol.run import RankLaunch, RankSite, decode_run_spec
from walkserve.transport import shm


class RankHost:
    def __init__(self, spec: bytes, rank: int, conductor: str, env: dict[str, str], device: str = ""):
        self.spec, self.rank, self.conductor, self.env, self.device = spec, rank, conductor, env, device
        self.proc: subprocess.Popen | None = None
        self.shm_id = ""

    def start(self) -> dict:
        """Start the rank's worker; returns where it runs (pid, this actor's pid, node IP and id, GPUs)."""
        import ray

        ctx = ray.get_runtime_context()
        host, node = ray.util.get_node_ip_address(), ctx.get_node_id()
        spec = decode_run_spec(self.spec)
        self.shm_id = f"{os.getpid():x}{spec.run_id[-6:]}"
        site = RankSite(f"tcp://{host}:0", self.conductor, node, host, self.device, self.shm_id)
        argv = [sys.executable, "-m", "walkserve.worker.main", "-", str(os.getpid())]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, env={**os.environ, **self.env}, close_fds=True)
        try:
            self.proc.stdin.write(msgspec.msgpack.encode(RankLaunch(spec, self.rank, site)))
            self.proc.stdin.close()
        except BrokenPipeError:
            pass  # it died at once; wait() reports how
        gpus = [str(g) for g in ctx.get_accelerator_ids().get("GPU", [])]
        return {"pid": self.proc.pid, "actor_pid": os.getpid(), "host": host, "node": node, "gpus": gpus}

    def wait(self) -> int:
        """Block until the worker exits; its return code as subprocess gives it (-N: killed by signal N)."""
        code = self.proc.wait()
        shm.sweep(self.shm_id)  # segments it wrote that no reader mapped (it died mid-transfer)
        return code

    def ping(self) -> int:
        return os.getpid()
