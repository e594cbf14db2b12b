"""RaySupervisor: the ranks of a ``launcher: ray`` placement as Ray actors, watched like local workers.

Same face as ``Supervisor`` (``start_all``, ``dead``, ``restart``, ``forget``,
``stop_all``), so the conductor's death path does not know which launcher runs:

    start_all   join the cluster; listen on this node's IP too; refuse at once what no live node can
                hold; reserve one placement group for the run, every rank's bundle or none, within
                placement_timeout_s; then one RankHost actor per rank on its bundle
    dead        every ~20 ms a zero-timeout ray.wait on each rank's pending wait() call: it returns
                when the worker exits (its exit code or signal) and raises when the actor or its node
                dies (ActorDiedError, ActorUnavailableError)
    restart     a worker that died under a live actor starts again in that actor; a dead actor is
                killed and replaced on the same bundle (pending while its node is gone)
    lost        restarted ranks Ray has not placed within placement_timeout_s (their node stays lost)
    stop_all    wait for the workers to leave after Stop, kill every actor, remove the placement
                group, disconnect (the cluster goes on: walkserve never starts or stops one)

Ray's owner fate-sharing takes every actor (and through PDEATHSIG its worker)
down when the conductor dies, on every node.
"""

from __future__ import annotations

import logging
import os
import time

from walkserve.conductor import ray_cluster
from walkserve.conductor.ray_cluster import Bundle
from walkserve.core.errors import PlacementError
from walkserve.core.proc import describe_exit
from walkserve.placement.plan import Placement
from walkserve.protocol.run import RunSpec, encode_run_spec
from walkserve.transport.ipc import Inbox

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 0.02


def _cause(e: Exception) -> str:
    """The first informative line of a Ray error, short."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    for ln in lines:
        if "worker process" in ln or "connection" in ln.lower() or "Exit" in ln:
            return ln[:200]
    return (lines[0] if lines else type(e).__name__)[:200]


class RayRank:
    """One rank: its actor, the pending start() and wait() calls, and what they returned."""

    def __init__(self, actor, bundle: Bundle, deadline: float):
        self.actor, self.bundle, self.deadline = actor, bundle, deadline
        self.start_ref = actor.start.remote()
        self.wait_ref = actor.wait.remote()
        self.info: dict | None = None
        self.exit: str | None = None  # why it ended, once it did
        self.actor_alive = True
        self.lost_reported = False

    @property
    def pid(self) -> int | None:
        return self.info["pid"] if self.info else None

    @property
    def host(self) -> str:
        return self.info["host"] if self.info else (self.bundle.host or "its node")

    def started(self, ray) -> None:
        try:
            self.info = ray.get(self.start_ref)
        except ray.exceptions.RayError:
            pass  # the wait() call fails too, and says why

    def ended(self, ray) -> None:
        try:
            self.exit = f"pid {self.pid} on {self.host} {describe_exit(ray.get(self.wait_ref))}"
            return
        except ray.exceptions.ActorUnavailableError:
            self.exit = f"node {self.host} unreachable: its Ray actor is unavailable"
        except ray.exceptions.RayActorError as e:
            actor = f" (pid {self.info['actor_pid']})" if self.info else ""
            self.exit = f"its Ray actor{actor} on {self.host} died: {_cause(e)}"
        except ray.exceptions.RayError as e:
            self.exit = f"its Ray actor on {self.host} failed: {_cause(e)}"
        self.actor_alive = False


class RaySupervisor:
    def __init__(self, spec: RunSpec, placement: Placement, inbox: Inbox):
        self.spec, self.placement, self.inbox = spec, placement, inbox
        self.ranks = sorted(placement.ranks)
        self.procs: dict[int, RayRank] = {}
        self.restarts: dict[int, int] = {r: 0 for r in self.ranks}
        self.zygote = None
        self.pg = None
        self.bundles: dict[int, tuple[int, Bundle]] = {}
        self.host = ""
        self.conductor_address = ""
        self._cls = None
        self._spec_bytes = encode_run_spec(spec)
        self._env = {**{k: v for k, v in os.environ.items() if k.startswith("WALKSERVE_")}, **spec.config.worker_environ()}
        self._last_check = 0.0
        self._joined = False

    # ---- start ---------------------------------------------------------------------------------
    def start_all(self) -> None:
        self.host = ray_cluster.join(self.spec.config.ray_address)
        self._joined = True
        self.conductor_address = self.inbox.bind(f"tcp://{self.host}:0")
        bundles = ray_cluster.plan_bundles(self.placement, self.host)
        ray_cluster.check_feasible(self.placement.source, bundles, ray_cluster.nodes())
        self.bundles = {b.rank: (i, b) for i, b in enumerate(bundles)}
        self.pg = self._reserve(bundles)
        for rank in self.ranks:
            self.start(rank)
        log.info("started %d ranks as Ray actors (placement group %s, conductor at %s)",
                 len(self.ranks), self.pg.id.hex(), self.conductor_address)

    def _reserve(self, bundles: list[Bundle]):
        """Every rank's resources at once, or nothing (the group is removed and the reason raised)."""
        from ray.util.placement_group import placement_group, remove_placement_group

        labels = [b.labels for b in bundles] if any(b.labels for b in bundles) else None
        pg = placement_group([b.resources for b in bundles], strategy="PACK", name=f"ws-{self.spec.run_id}",
                             bundle_label_selector=labels)
        t0 = time.monotonic()
        if not pg.wait(self.spec.config.placement_timeout_s):
            remove_placement_group(pg)
            waited = time.monotonic() - t0
            raise PlacementError(ray_cluster.explain_pending(self.placement.source, bundles, ray_cluster.nodes(), waited))
        return pg

    def _actor_class(self):
        if self._cls is None:
            import ray

            from walkserve.conductor.ray_host import RankHost

            self._cls = ray.remote(RankHost)
        return self._cls

    def start(self, rank: int, actor=None) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        index, bundle = self.bundles[rank]
        if actor is None:
            needs = bundle.needs
            options = {"num_cpus": needs.get("CPU", 0.0), "num_gpus": needs.get("GPU", 0.0)}
            if "memory" in needs:
                options["memory"] = needs["memory"]
            device = "cuda" if self.placement.ranks[rank].device.startswith("cuda") else ""
            actor = self._actor_class().options(
                name=f"ws-{self.spec.run_id}-rank{rank}-{self.restarts[rank]}",
                max_restarts=0, max_task_retries=0, max_concurrency=1,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=index),
                **options,
            ).remote(self._spec_bytes, rank, self.conductor_address, self._env, device)
        self.procs[rank] = RayRank(actor, bundle, time.monotonic() + self.spec.config.placement_timeout_s)
        log.info("starting rank %d as a Ray actor (bundle %d%s)", rank, index, f", host {bundle.host}" if bundle.host else "")

    # ---- watch ---------------------------------------------------------------------------------
    def sentinels(self) -> list[int]:
        return []  # nothing to poll: dead() asks Ray at most every CHECK_INTERVAL_S

    def dead(self) -> list[tuple[int, str]]:
        now = time.monotonic()
        if not self.procs or now - self._last_check < CHECK_INTERVAL_S:
            return []
        self._last_check = now
        import ray

        pending = {}
        for r in self.procs.values():
            if r.info is None:
                pending[r.start_ref] = (r, True)
            if r.exit is None:
                pending[r.wait_ref] = (r, False)
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0, fetch_local=True) if pending else ([], [])
        for ref in sorted(ready, key=lambda ref: not pending[ref][1]):  # starts first: the host names the exit
            r, is_start = pending[ref]
            r.started(ray) if is_start else r.ended(ray)
        return [(rank, r.exit) for rank, r in self.procs.items() if r.exit is not None]

    def lost(self) -> list[tuple[int, str]]:
        """Ranks whose bundle Ray has not placed within placement_timeout_s (their node is gone; reported once).

        A rank whose bundle sits on a live node is only slow to start (a loaded
        node spawning its actor): its deadline moves on instead.
        """
        now = time.monotonic()
        late = [(rank, r) for rank, r in self.procs.items()
                if r.info is None and r.exit is None and not r.lost_reported and now > r.deadline]
        if not late:
            return []
        placed = self._placed_bundles()
        out = []
        for rank, r in late:
            if self.bundles[rank][0] in placed:
                r.deadline = now + self.spec.config.placement_timeout_s
                continue
            r.lost_reported = True
            verb = "restart" if self.restarts[rank] else "start"
            out.append((rank, f"cannot {verb}: {self._unplaced(r)}"))
        return out

    def _placed_bundles(self) -> set[int]:
        """Indices of this run's bundles that sit on a live node now."""
        from ray.util.placement_group import placement_group_table

        live = {n.node_id for n in ray_cluster.nodes() if n.alive}
        table = placement_group_table(self.pg) if self.pg is not None else {}
        return {int(i) for i, node in (table.get("bundles_to_node_id") or {}).items() if node in live}

    def _unplaced(self, r: RayRank) -> str:
        host = r.bundle.host
        live = sorted(n.ip for n in ray_cluster.nodes() if n.alive)
        if host is not None and host not in live:
            return f"host {host} is not in the Ray cluster (alive: {', '.join(live) or 'none'})"
        return f"Ray has not placed its bundle within {self.spec.config.placement_timeout_s:.0f} s"

    def pids(self) -> dict[int, int]:
        return {rank: r.pid for rank, r in self.procs.items() if r.pid is not None}

    def describe(self) -> dict:
        return {
            "placement_group": self.pg.id.hex() if self.pg is not None else None,
            "actor_pids": {rank: r.info["actor_pid"] for rank, r in self.procs.items() if r.info},
            "node_ids": {rank: r.info["node"] for rank, r in self.procs.items() if r.info},
            "gpus": {rank: r.info["gpus"] for rank, r in self.procs.items() if r.info and r.info["gpus"]},
            "conductor_address": self.conductor_address,
        }

    # ---- restart and stop ----------------------------------------------------------------------
    def restart(self, rank: int) -> None:
        old = self.procs.pop(rank)
        self.restarts[rank] += 1
        if old.actor_alive:
            self.start(rank, actor=old.actor)  # only the worker died: a new one in the same actor
        else:
            self._kill(old.actor)
            self.start(rank)

    def forget(self, rank: int) -> None:
        old = self.procs.pop(rank, None)
        if old is not None:
            self._kill(old.actor)

    @staticmethod
    def _kill(actor) -> None:
        import ray

        try:
            ray.kill(actor, no_restart=True)
        except Exception as e:  # already gone
            log.debug("ray.kill: %s", e)

    def stop_all(self, grace_s: float = 3.0) -> None:
        """Every actor killed, the placement group removed, this driver disconnected; each step runs even if one fails."""
        if not self._joined:
            return
        import ray
        from ray.util.placement_group import remove_placement_group

        t0 = time.monotonic()
        try:
            waits = [r.wait_ref for r in self.procs.values() if r.exit is None]
            if waits:
                ray.wait(waits, num_returns=len(waits), timeout=grace_s)  # the workers leave after Stop
            actors = [r.actor for r in self.procs.values()]
            for actor in actors:
                self._kill(actor)
            if actors:  # a call to a killed actor fails once it is dead: wait for that, briefly
                pings = [a.ping.remote() for a in actors]
                ray.wait(pings, num_returns=len(pings), timeout=5)

        except Exception as e:
            log.warning("stopping the Ray ranks: %s", e)
        self.procs.clear()
        try:
            if self.pg is not None:
                remove_placement_group(self.pg)
        except Exception as e:
            log.warning("removing the placement group: %s", e)
        self.pg = None
        ray.shutdown()  # disconnects this driver; the cluster it joined goes on
        log.info("stopped the Ray ranks and removed their placement group in %.2f s", time.monotonic() - t0)
        self._joined = False
