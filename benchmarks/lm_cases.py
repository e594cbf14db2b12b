"""The four ways ``./dev bench lm`` generates the same greedy tokens, each timed on its own.

    hf_sequential   (a) transformers ``generate``, one request after another
    hf_batched      (b) transformers ``generate`` on the whole batch, left-padded
    bare_engine     (c) our CausalLM on a KVCacheEngine driven by a plain loop (no runtime)
    served          (d) walkserve: AsyncEngine, one CPU worker, one concurrent ``generate`` per request

Every case returns a CaseResult: the generated ids per request, the wall
time of the timed part, and per-request output timestamps where the case
streams (c, d). transformers is imported here only: it is a baseline, never
a walkserve dependency.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from walkserve.core.sampling import SamplingParams
from walkserve.worker.main import EXECUTOR_THREAD


@dataclass(frozen=True)
class Workload:
    """What every case generates: ``prompts`` (token ids), ``new_tokens`` greedy tokens each, EOS ignored."""

    path: Path
    dtype: str
    prompts: tuple[tuple[int, ...], ...]
    new_tokens: int
    threads: int
    device: str = "cpu"

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


@dataclass
class CaseResult:
    """One case's outcome. ``stamps[i]``: seconds since the timed start at which request i got each token."""

    name: str
    tokens: list[list[int]]
    seconds: float
    stamps: list[list[float]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def tokens_per_s(self) -> float:
        return sum(len(t) for t in self.tokens) / self.seconds

    def ttfts(self) -> list[float]:
        return [s[0] for s in self.stamps if s]

    def gaps(self) -> list[float]:
        return [b - a for s in self.stamps for a, b in itertools.pairwise(s)]


# ---- (a), (b): transformers ----------------------------------------------------------------------


def _hf_model(work: Workload):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(work.path, dtype=work.torch_dtype).eval().to(work.device)
    model.generation_config.eos_token_id = None  # EOS ignored: every request makes new_tokens tokens
    return model


def _hf_generate(model, ids: torch.Tensor, mask: torch.Tensor, new_tokens: int) -> torch.Tensor:
    ids, mask = ids.to(model.device), mask.to(model.device)
    return model.generate(
        ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0
    )[:, ids.shape[1] :]


@torch.inference_mode()
def hf_sequential(work: Workload, count: int) -> CaseResult:
    """(a) One request at a time, as a server without batching would; ``count`` evenly spread prompts of the
    workload (sequential throughput does not depend on how many run; the subset keeps the run short)."""
    torch.set_num_threads(work.threads)
    model = _hf_model(work)
    one = lambda p: torch.tensor([p])  # noqa: E731
    _hf_generate(model, one(work.prompts[0]), torch.ones_like(one(work.prompts[0])), 4)  # warm-up
    count = max(1, min(count, len(work.prompts)))
    indices = [round(i * (len(work.prompts) - 1) / max(count - 1, 1)) for i in range(count)]
    out = []
    _sync(work)
    t0 = time.perf_counter()
    for i in indices:
        ids = one(work.prompts[i])
        out.append(_hf_generate(model, ids, torch.ones_like(ids), work.new_tokens)[0].tolist())
    _sync(work)
    return CaseResult("hf_sequential", out, time.perf_counter() - t0, extra={"indices": indices})


@torch.inference_mode()
def hf_batched(work: Workload) -> CaseResult:
    """(b) The whole batch in one ``generate`` call, prompts left-padded with id 0."""
    torch.set_num_threads(work.threads)
    model = _hf_model(work)
    width = max(len(p) for p in work.prompts)
    ids = torch.zeros(len(work.prompts), width, dtype=torch.long)  # [B, Lmax]
    mask = torch.zeros_like(ids)
    for i, prompt in enumerate(work.prompts):
        ids[i, width - len(prompt) :] = torch.tensor(prompt)
        mask[i, width - len(prompt) :] = 1
    _hf_generate(model, ids, mask, 4)  # warm-up (the whole batch: the timed call's shapes)
    _sync(work)
    t0 = time.perf_counter()
    out = _hf_generate(model, ids, mask, work.new_tokens)
    tokens = out.tolist()  # waits for the device
    return CaseResult("hf_batched", tokens, time.perf_counter() - t0)


def _warm_prompts(work: Workload) -> tuple[tuple[int, ...], ...]:
    """Two prompts on the CPU; on a GPU all of them, so every decode batch size (graph bucket) is met once."""
    return work.prompts[:2] if work.device == "cpu" else work.prompts


def _sync(work: Workload) -> None:
    if work.device.startswith("cuda"):
        torch.cuda.synchronize()


# ---- (c): the bare engine loop -------------------------------------------------------------------


def _greedy(work: Workload) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=work.new_tokens, ignore_eos=True)


class _Driver:
    """Feeds a KVCacheEngine the firings the served walks would: prompt[:-1] (KV only), then a decode loop."""

    def __init__(self, engine, work: Workload):
        self.engine, self.work = engine, work
        self.ids = itertools.count()
        self.tokens: list[list[int]] = [[] for _ in work.prompts]
        self.stamps: list[list[float]] = [[] for _ in work.prompts]

    def firing(self, i: int, tokens: list[int], outputs: tuple[str, ...]):
        from walkserve.engines.base import Firing

        t = torch.tensor(tokens, dtype=torch.long)
        walk = "decode" if outputs else "prefill"
        return Firing(next(self.ids), f"req{i}", walk, "lm", "lm", "forward", (len(self.tokens[i]),),
                      {"tokens": t}, outputs, sampling=_greedy(self.work))

    def run(self, t0: float) -> None:
        for i, prompt in enumerate(self.work.prompts):
            if len(prompt) > 1:
                self.engine.submit(self.firing(i, list(prompt[:-1]), ()))
            self.engine.submit(self.firing(i, list(prompt[-1:]), ("token",)))
        while self.engine.has_work():
            for result in self.engine.step():
                assert result.error is None, result.error
                if "token" in (result.outputs or {}):
                    self._on_token(int(result.firing.request_id[3:]), int(result.outputs["token"][0]), t0)

    def _on_token(self, i: int, token: int, t0: float) -> None:
        self.tokens[i].append(token)
        self.stamps[i].append(time.perf_counter() - t0)
        if len(self.tokens[i]) < self.work.new_tokens:
            self.engine.submit(self.firing(i, [token], ("token",)))
        else:
            self.engine.release(f"req{i}")


def bare_engine(work: Workload, kv_options: dict[str, Any]) -> CaseResult:
    """(c) The roofline: the served model's engine stepped in a plain loop, no processes, no graph
    (with ``cuda_graphs`` in ``kv_options``, case (e): decode steps replay CUDA graphs). The loop
    runs on a thread of its own, as a worker's heartbeat does: on a busy machine, two OpenMP threads
    driven from a process's main thread ran the same steps several times slower."""
    box: list[CaseResult | BaseException] = []

    def run() -> None:
        try:
            box.append(_bare_engine(work, kv_options))
        except BaseException as e:
            box.append(e)

    thread = threading.Thread(target=run, name="bare-engine")
    thread.start()
    thread.join()
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def _bare_engine(work: Workload, kv_options: dict[str, Any]) -> CaseResult:
    from walkserve.core.options import KVOptions
    from walkserve.engines.kv.engine import KVCacheEngine
    from walkserve.models.llama.weights import load_causal_lm

    torch.set_num_threads(work.threads)
    model = load_causal_lm(work.path, device=work.device, dtype=work.dtype, progress=False)
    engine = KVCacheEngine("lm", model, work.device, work.dtype, KVOptions(**kv_options))
    warm = Workload(work.path, work.dtype, _warm_prompts(work), 4, work.threads, work.device)
    _Driver(engine, warm).run(time.perf_counter())
    driver = _Driver(engine, work)
    meter = _StepMeter(engine)
    load, wait0 = os.getloadavg()[0], _proc_wait(os.getpid())
    t0, cpu0 = time.perf_counter(), time.process_time()
    driver.run(t0)
    seconds = time.perf_counter() - t0
    extra = {"kv_blocks_peak": meter.peak, "kv_blocks_total": engine.block_manager.num_blocks,
             "preemptions": engine.scheduler.preemptions, "steps": meter.steps, "busy_s": meter.busy_s,
             "step_cpu_s": meter.cpu_s, "process_cpu_s": time.process_time() - cpu0,
             "wait_s": _proc_wait(os.getpid()) - wait0, "load": load}
    extra.update({k: v for k, v in engine.stats().items() if k.startswith("cuda_graph")})
    engine.close()
    return CaseResult("bare_engine", driver.tokens, seconds, driver.stamps, extra)


class _StepMeter:
    """Counts the engine's forward steps and the time spent in them; tracks the most KV blocks in use."""

    def __init__(self, engine):
        self.steps, self.busy_s, self.cpu_s, self.peak = 0, 0.0, 0.0, 0
        step = engine.step

        def metered():
            t0, c0 = time.perf_counter(), time.thread_time()
            out = step()
            self.busy_s += time.perf_counter() - t0
            self.cpu_s += time.thread_time() - c0
            self.steps += 1
            self.peak = max(self.peak, engine.block_manager.num_used)
            return out

        engine.step = metered


# ---- (d): served through the runtime -------------------------------------------------------------


def served(work: Workload, kv_options: dict[str, Any]) -> CaseResult:
    """(d) The checkpoint as a ``llama`` model on AsyncEngine (conductor + one CPU worker process)."""
    return asyncio.run(_served(work, kv_options))


async def _served(work: Workload, kv_options: dict[str, Any]) -> CaseResult:
    from walkserve.core.config import RuntimeConfig
    from walkserve.entrypoint.engine import AsyncEngine

    config = RuntimeConfig(worker_threads=work.threads, dtype=work.dtype, engine_options={"kv": dict(kv_options)},
                           status_interval_s=0.05)
    engine = await AsyncEngine.start("llama", model_path=str(work.path), config=config, placement=_placement(work))
    try:
        warm = Workload(work.path, work.dtype, _warm_prompts(work), 4, work.threads, work.device)
        await asyncio.gather(*[_stream(engine, warm, p, 0.0) for p in warm.prompts])
        before = await _compute_totals(engine)
        cpu = _CpuClock(engine)
        poll = _KVPoller(engine)
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        outs = await asyncio.gather(*[_stream(engine, work, p, t0) for p in work.prompts])
        seconds = time.perf_counter() - t0
        cpu_s = cpu.read()
        peak = poll.stop()
        after = await _compute_totals(engine)
        stats = engine.stats()
        extra = {"kv_blocks_peak": max(peak, stats.kv_blocks_used), "kv_blocks_total": stats.kv_blocks_total,
                 "preemptions": stats.preemptions, "steps": after[0] - before[0], "busy_s": after[1] - before[1],
                 "cpu_s": cpu_s, "step_cpu_s": cpu_s["worker.main"] + cpu_s["worker.others"],
                 "process_cpu_s": cpu_s["worker.main"] + cpu_s["worker.others"], "wait_s": cpu_s["worker.wait"],
                 "load": load}
    finally:
        await engine.shutdown()
    return CaseResult("served", [o[0] for o in outs], seconds, [o[1] for o in outs], extra)


def _placement(work: Workload) -> dict:
    """The model's default placement (every node on rank 0), on ``work.device`` (the CPU even where CUDA exists)."""
    import walkserve.models.builtin  # noqa: F401  (registers the families)
    from walkserve.models.base import ModelRef
    from walkserve.models.registry import load_model

    placement = load_model(ModelRef("llama", str(work.path))).default_placement()
    for rank in placement["ranks"]:
        rank["device"] = "cuda:0" if work.device.startswith("cuda") else "cpu"
    return placement


async def _stream(engine, work: Workload, prompt: tuple[int, ...], t0: float) -> tuple[list[int], list[float]]:
    from walkserve.core.outputs import OutputEvent

    spec = engine.processor.build_request("completion", {"prompt_token_ids": list(prompt)}, _greedy(work), engine.processor.check_params({}))
    tokens: list[int] = []
    stamps: list[float] = []
    async for event in engine.generate(spec):
        if isinstance(event, OutputEvent):
            tokens.extend(int(t) for t in event.data.tolist())
            stamps.append(time.perf_counter() - t0)
        elif event.error:
            raise RuntimeError(f"request failed: {event.error}")
    return tokens, stamps


async def _compute_totals(engine) -> tuple[int, float]:
    """(engine steps, seconds inside engine steps) so far, summed over the workers."""
    await engine.refresh_status()
    await asyncio.sleep(0.6)  # a worker reports every 0.5 s; let a fresh report reach the status
    await engine.refresh_status()
    workers = engine.status.stats.workers.values()
    return (sum(sum(w.steps.values()) for w in workers), float(sum(sum(w.busy_s.values()) for w in workers)))


class _CpuClock:
    """CPU seconds each runtime process (and the worker's threads) used since construction, from /proc.

    worker.main = the worker's thread (messages, the executor, the engine step and the first of
    torch's OpenMP threads); worker.others = its other threads (torch's other OpenMP threads, ZeroMQ's
    I/O thread, the parent watcher); worker.wait = the seconds its threads were runnable but had no core;
    conductor; client = this process (asyncio, decoding events).
    """

    def __init__(self, engine):
        self.pids = {"conductor": engine.process.pid, "workers": list(engine.status.stats.pids.values())}
        self.start = self._now()

    def _now(self) -> dict[str, float]:
        out = {"conductor": _proc_cpu(self.pids["conductor"]), "client": time.process_time(),
               "worker.main": 0.0, "worker.others": 0.0, "worker.wait": 0.0}
        for pid in self.pids["workers"]:
            main = _proc_cpu(pid, _executor_tid(pid))
            out["worker.main"] += main
            out["worker.others"] += _proc_cpu(pid) - main
            out["worker.wait"] += _proc_wait(pid)
        return out

    def read(self) -> dict[str, float]:
        now = self._now()
        return {k: now[k] - self.start[k] for k in now}


def _executor_tid(pid: int) -> int:
    """The worker's heartbeat thread (named by walkserve.worker.main), else its main thread."""
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            if (task / "comm").read_text().strip() == EXECUTOR_THREAD:
                return int(task.name)
        except OSError:
            continue
    return pid


def _proc_cpu(pid: int, tid: int | None = None) -> float:
    """utime + stime of a process (or one of its threads) in seconds; 0 where /proc is not readable."""
    path = f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat"
    try:
        fields = Path(path).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _proc_wait(pid: int) -> float:
    """Seconds the threads of a process have spent runnable but waiting for a core (schedstat; 0 without it)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


class _KVPoller:
    """Samples the KV blocks the worker reports in use (status every 50 ms) while the timed run goes on."""

    def __init__(self, engine):
        self.engine, self.peak = engine, 0
        self.task = asyncio.create_task(self._poll())

    async def _poll(self) -> None:
        while True:
            self.peak = max(self.peak, self.engine.stats().kv_blocks_used)
            await asyncio.sleep(0.05)

    def stop(self) -> int:
        self.task.cancel()
        return self.peak
