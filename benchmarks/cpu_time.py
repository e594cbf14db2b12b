"""Where a benchmark case's wall time went on a Linux machine, from /proc: our processes and the rest.

Per process of this benchmark (this one and every descendant: the conductor, the workers) and per
thread: seconds running, seconds runnable but waiting for a core (``/proc/<pid>/task/<tid>/schedstat``),
and the rest of the wall time asleep (waiting for input). And the machine's busy core-seconds
(``/proc/stat``), so a figure taken while other work shares the cores says how much of them it had.
On a machine without /proc every figure is empty.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass
class Snapshot:
    machine_busy_s: float = 0.0  # every core's non-idle seconds since boot
    titles: dict[int, str] = field(default_factory=dict)  # pid -> its command line (workers set a title)
    threads: dict[int, dict[int, tuple[float, float]]] = field(default_factory=dict)  # pid -> tid -> (run, wait)


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _machine_busy_s() -> float:
    fields = _read("/proc/stat").split("\n", 1)[0].split()[1:9]  # user nice system idle iowait irq softirq steal
    if len(fields) < 8:
        return 0.0
    ticks = [int(x) for x in fields]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def _tree(root: int) -> list[int]:
    parent: dict[int, list[int]] = {}
    for d in os.listdir("/proc") if os.path.isdir("/proc") else []:
        stat = _read(f"/proc/{d}/stat") if d.isdigit() else ""
        if stat:
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            parent.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += parent.get(pid, [])
    return out


def snapshot(root: int | None = None) -> Snapshot:
    snap = Snapshot(_machine_busy_s())
    for pid in _tree(root or os.getpid()):
        tasks = f"/proc/{pid}/task"
        threads = {}
        for tid in os.listdir(tasks) if os.path.isdir(tasks) else []:
            parts = _read(f"{tasks}/{tid}/schedstat").split()
            if len(parts) >= 2:
                threads[int(tid)] = (int(parts[0]) / 1e9, int(parts[1]) / 1e9)
        snap.threads[pid] = threads
        snap.titles[pid] = _read(f"/proc/{pid}/cmdline").replace("\0", " ").strip()
    return snap


@dataclass(frozen=True)
class Usage:
    """Between two snapshots: per worker rank its busiest thread (the executor thread that steps its engines) and all its threads."""

    wall_s: float
    ours_s: float  # core-seconds our processes ran
    machine_s: float  # core-seconds the whole machine ran
    ranks: dict[int, tuple[float, float, float]]  # rank -> busiest thread's (running, waiting for a core, asleep)
    rank_cpu_s: dict[int, float]  # rank -> all its threads' running seconds

    def line(self) -> str:
        if not self.machine_s:
            return "(no /proc)"
        parts = [f"our processes {self.ours_s / self.wall_s:.2f} cores, the rest of the machine "
                 f"{max(0.0, self.machine_s - self.ours_s) / self.wall_s:.2f}"]
        for rank, (run, wait, sleep) in sorted(self.ranks.items()):
            parts.append(f"rank {rank} ({self.rank_cpu_s[rank]:.1f} s CPU): executor thread running {run:.1f} s, "
                         f"waiting for a core {wait:.1f} s, asleep {sleep:.1f} s")
        return "; ".join(parts)


def usage(before: Snapshot, after: Snapshot, wall_s: float) -> Usage:
    ours, ranks, rank_cpu = 0.0, {}, {}
    for pid, threads in after.threads.items():
        old = before.threads.get(pid, {})
        deltas = [(run - old.get(tid, (0.0, 0.0))[0], wait - old.get(tid, (0.0, 0.0))[1])
                  for tid, (run, wait) in threads.items()]
        ours += sum(d[0] for d in deltas)
        title = after.titles.get(pid, "")
        if "worker rank " in title and deltas:
            rank = int(title.split("worker rank ", 1)[1].split()[0])
            run, wait = max(deltas)
            ranks[rank] = (run, wait, max(0.0, wall_s - run - wait))
            rank_cpu[rank] = sum(d[0] for d in deltas)
    return Usage(wall_s, ours, after.machine_busy_s - before.machine_busy_s, ranks, rank_cpu)
