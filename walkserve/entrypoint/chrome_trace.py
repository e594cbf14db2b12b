"""A request's timeline as Chrome/Perfetto trace-event JSON, and the sink that writes one file per request.

    pid   one per process: the frontend (HTTP, requests), the conductor (admission, walks), each rank
    tid   one per row inside it: a node of that rank, a transfer's destination, "walks", ...
    "X"   a complete event (``ts``, ``dur`` in microseconds from the trace's start)
    "M"   names for the processes and rows

Open it in https://ui.perfetto.dev or chrome://tracing (both read the file locally).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from walkserve.core.errors import ConfigError
from walkserve.entrypoint.timeline import FRONTEND_RANK, RequestTrace, TimelineStore
from walkserve.protocol import messages as m

_ROW = {"node": "node {name}", "transfer": "to {name}", "walk": "walks", "admission": "admission", "queue": "admission"}


def chrome_trace(trace: RequestTrace, frontend_pid: int) -> dict[str, Any]:
    t0 = min([trace.started_ns, *(r.submitted_ns for r in trace.requests.values()),
              *(rec.start_ns for _, _, rec in trace.records)])
    rows = _Rows()
    events: list[dict[str, Any]] = []

    def event(rank: int, pid: int, row: str, name: str, start: int, end: int, args: dict) -> None:
        events.append({"ph": "X", "name": name, "cat": row.split(" ")[0], "pid": pid, "tid": rows.tid(rank, pid, row),
                       "ts": (start - t0) / 1000, "dur": max(end - start, 0) / 1000, "args": args})

    if trace.http and "end_ns" in trace.http:
        event(FRONTEND_RANK, frontend_pid, "http", trace.http["name"], trace.started_ns, trace.http["end_ns"],
              {"status": trace.http["status"], **trace.http["attributes"]})
    for rid, req in trace.requests.items():
        end = req.finished_ns or max([req.submitted_ns, *(rec.end_ns for _, _, rec in trace.records)])
        event(FRONTEND_RANK, frontend_pid, f"request {rid}", f"request {rid}", req.submitted_ns, end,
              {"request_id": rid, "finish_reason": req.reason})
    for rank, pid, rec in trace.records:
        event(rank, pid, _ROW.get(rec.kind, rec.kind).format(name=rec.name), _event_name(rec), rec.start_ns, rec.end_ns,
              {"walk": rec.walk, "request_ids": list(rec.request_ids), **rec.attrs})
    other = {"key": trace.key, "start_unix_ns": t0, "dropped_records": trace.dropped}
    if trace.context is not None:
        other["trace_id"] = trace.context.trace_hex
    return {"traceEvents": rows.metadata() + events, "displayTimeUnit": "ms", "otherData": other}


def _event_name(rec: m.Timing) -> str:
    if rec.kind == "node":
        return rec.name
    if rec.kind == "transfer":
        return f"{rec.attrs.get('message', 'message')} to {rec.name}"
    return f"walk {rec.name}" if rec.kind == "walk" else rec.kind


class _Rows:
    """Thread ids per process, in order of first use, and the metadata events that name them."""

    def __init__(self) -> None:
        self.processes: dict[int, int] = {}  # pid -> rank
        self.tids: dict[tuple[int, str], int] = {}

    def tid(self, rank: int, pid: int, row: str) -> int:
        self.processes.setdefault(pid, rank)
        key = (pid, row)
        if key not in self.tids:
            self.tids[key] = 1 + sum(1 for p, _ in self.tids if p == pid)
        return self.tids[key]

    def metadata(self) -> list[dict[str, Any]]:
        out = []
        for pid, rank in self.processes.items():
            name = {FRONTEND_RANK: "frontend", -1: "conductor"}.get(rank, f"rank {rank}")
            out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"{name} (pid {pid})"}})
            out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": rank + 3}})
        for (pid, row), tid in self.tids.items():
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": row}})
        return out


class TraceDirSink:
    """``--trace-dir``: ``DIR/<key>.json`` per request, rewritten when late records arrive."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"trace_dir {str(directory)!r} cannot be created: {e}") from None

    def export(self, trace: RequestTrace, store: TimelineStore, new: list, first: bool) -> None:
        name = re.sub(r"[^A-Za-z0-9._-]", "_", trace.key) + ".json"
        path = self.directory / name
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(chrome_trace(trace, store.pid)))
        tmp.replace(path)

    def close(self) -> None:
        pass
