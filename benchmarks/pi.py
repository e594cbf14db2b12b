"""pi0 action chunks: walkserve against transformers' PI0 ``sample_actions``, side by side in one run.

    ./dev bench pi [--quick] [--preset bench|tiny] [--requests N] [--concurrency C] [--rounds R] [--threads T]
                   [--repeats K] [--device cpu|cuda]

Both run the same random-weight lerobot-layout pi0 checkpoint (``walkserve tiny
pi0 --preset bench``: the released shapes with widths / 8 and 6 layers, two
224 px cameras of 256 tokens, horizon 50, 10 flow steps; ``--quick``: the tiny
preset and fewer requests) on the same requests (explicit noise), in float32
on the same device (the CPU by default, with the same thread count):

- reference: ``PI0ForConditionalGeneration.sample_actions`` in this process, one request at a time (the
  prefix once, then 10 expert steps over its cache); served to C clients it still runs one at a time;
- walkserve: ``AsyncEngine`` with one worker (the runtime path of every API route, without HTTP); C
  clients (robots) each send their next request when their last chunk arrives, client i the requests
  i, i + C, i + 2C, ...

``--repeats K`` makes each robot send each of its observations K times in a row (a robot whose cameras,
state and prompt have not changed between chunks; the noise differs), so walkserve's prefix cache can
stand in for the prefix; the reference computes every chunk whole, as transformers does.

Reported: chunk latency p50/p95 at concurrency 1 and at C; chunks per second at
C; the ratios (targets: latency <= 1.1x the reference's, throughput >= 3x); the
prefix / flow split of each (the reference's prefix alone timed on the same
inputs; walkserve's from its engines' busy time per request); the prefix's and
the expert's batch sizes (requests per PaliGemma forward and SigLIP call, per
expert call); and the prefix rows the prefix cache supplied. Rounds alternate the two systems so a
shared machine's drift hits both alike.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmarks.common import conditions, pct, table
from benchmarks.pi_flops import chunk_flops, gemm_rate

CAMERAS = ("base_0_rgb", "left_wrist_0_rgb")  # DROID's two views; the third slot is absent (masked)


@dataclass
class Served:
    latencies: list[float] = field(default_factory=list)
    wall: float = 0.0
    requests: int = 0
    cpu: float = 0.0  # CPU seconds the system used (this process; walkserve: and its worker processes)
    engine: dict[str, float] = field(default_factory=dict)  # stats deltas
    nodes: dict[str, float] = field(default_factory=dict)


def observations(n: int, horizon: int, resolution: int, seed: int = 0, concurrency: int = 1,
                 repeats: int = 1) -> list[dict]:
    """``n`` requests; request i is robot i mod ``concurrency``'s (i // concurrency)-th, and each robot asks
    ``repeats`` chunks in a row for one observation (cameras, state, prompt; its own noise each time)."""
    rng = np.random.default_rng(seed)
    turns = math.ceil(n / concurrency)  # requests each robot sends
    per_robot = math.ceil(turns / repeats)  # observations it goes through
    scenes = [{**{c: rng.integers(0, 256, (resolution, resolution, 3), dtype=np.uint8) for c in CAMERAS},
               "state": rng.uniform(-1, 1, 8).astype(np.float32), "prompt": f"pick up object {j} and place it left"}
              for j in range(concurrency * per_robot)]
    return [{**scenes[i % concurrency * per_robot + i // concurrency // repeats],
             "noise": rng.standard_normal((horizon, 32)).astype(np.float32)} for i in range(n)]


def reference_run(model, inputs: list, concurrency: int) -> Served:
    """One at a time: latency of a request that waits behind the others of its wave of ``concurrency``."""
    from walkserve.testing.pi0_reference import sample_actions

    out = Served()
    t0, c0 = time.perf_counter(), time.process_time()
    for start in range(0, len(inputs), concurrency):
        wave = time.perf_counter()
        for x in inputs[start:start + concurrency]:
            sample_actions(model, x)
            out.latencies.append(time.perf_counter() - wave)
    out.wall, out.requests, out.cpu = time.perf_counter() - t0, len(inputs), time.process_time() - c0
    return out


def cpu_seconds() -> float:
    """CPU seconds of this process and every live descendant (walkserve's workers), from /proc (nan elsewhere)."""
    total, tick = time.process_time(), os.sysconf("SC_CLK_TCK")
    try:
        pending = [os.getpid()]
        while pending:
            pid = pending.pop()
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    children = [int(c) for c in f.read().split()]
                for child in children:
                    with open(f"/proc/{child}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                    total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
                pending += children
    except (OSError, ValueError):
        return float("nan")
    return total


def reference_prefix_s(model, inputs: list) -> float:
    from walkserve.testing.pi0_reference import prefix_only

    t0 = time.perf_counter()
    for x in inputs:
        prefix_only(model, x)
    return (time.perf_counter() - t0) / len(inputs)


def prefix_floor(path: Path, prepared: list, config, batch: int, repeats: int = 3) -> tuple[float, float]:
    """walkserve's own prefix, offline (its served vision and PaliGemma, dense attention): best CPU seconds of this
    thread per request for vision + PaliGemma one request at a time, and per request for the vision of ``batch``
    requests' cameras in one call (the part of a chunk that batching cannot share away)."""
    import torch

    from walkserve.layers.attention import DenseAttention
    from walkserve.models.pi0.components import build_component
    from walkserve.models.pi0.predict import camera_batch
    from walkserve.models.pi0.prefix import compact_prefix

    vision, lm = (build_component(part, path, "cpu", None) for part in ("vision", "lm"))
    device, resolution = torch.device("cpu"), config.image_resolution[0]

    def one(request) -> None:
        features = vision(camera_batch(request, resolution, device))  # [n, P, D]
        prefix = compact_prefix(lm, features.reshape(-1, features.shape[-1]), torch.tensor(request.token_ids))
        lm(torch.zeros(prefix.embeds.shape[0], dtype=torch.long), prefix.positions, DenseAttention(None, keep=True),
           inputs_embeds=prefix.embeds)

    many = torch.cat([camera_batch(r, resolution, device) for r in (prepared * batch)[:batch]])
    best = [float("inf"), float("inf")]
    with torch.inference_mode():
        one(prepared[0])
        for i in range(repeats):
            t0 = time.thread_time()
            one(prepared[i % len(prepared)])
            t1 = time.thread_time()
            vision(many)
            t2 = time.thread_time()
            best = [min(best[0], t1 - t0), min(best[1], (t2 - t1) / batch)]
    return best[0], best[1]


async def _one(engine, spec) -> float:
    from walkserve.core.outputs import RequestFinished

    t0 = time.perf_counter()
    async for event in engine.generate(spec):
        if isinstance(event, RequestFinished) and event.reason.value != "stop":
            raise RuntimeError(f"request failed: {event.error}")
    return time.perf_counter() - t0


async def served_run(engine, specs: list, concurrency: int) -> Served:
    out = Served()
    await engine.refresh_status()
    before = _snapshot(engine)

    async def client(mine: list):
        for spec in mine:
            out.latencies.append(await _one(engine, spec))

    t0, c0 = time.perf_counter(), cpu_seconds()
    await asyncio.gather(*(client(specs[i::concurrency]) for i in range(concurrency)))
    out.wall, out.requests, out.cpu = time.perf_counter() - t0, len(specs), cpu_seconds() - c0
    await engine.refresh_status()
    after = _snapshot(engine)
    out.engine = {k: after[0].get(k, 0.0) - before[0].get(k, 0.0) for k in after[0]}
    out.nodes = {k: after[1].get(k, 0.0) - before[1].get(k, 0.0) for k in after[1]}
    return out


def _snapshot(engine) -> tuple[dict[str, float], dict[str, float]]:
    stats = engine.stats()
    kv = next((v for k, v in stats.engines.items() if k.startswith("expert@")), {})
    nodes = {f"{n}.{k}": float(v) for n, s in stats.nodes.items() for k, v in s.items()}
    return dict(kv), nodes


def split_ms(run: Served) -> dict[str, float]:
    """Per request: prefix (vision + PaliGemma) and flow (expert + flow head) compute, from the engines' busy time."""
    n = max(run.requests, 1)
    e, nodes = run.engine, run.nodes
    prefix = e.get("forward_s.lm", 0.0) + nodes.get("vision.busy_s", 0.0)
    flow = e.get("forward_s.expert", 0.0) + sum(nodes.get(f"{k}.busy_s", 0.0) for k in ("flow_start", "flow_step",
                                                                                         "actions", "state_embed"))
    return {"prefix": 1e3 * prefix / n, "flow": 1e3 * flow / n}


def expert_batch(run: Served) -> tuple[float, float]:
    """(requests per expert call, rows per call) over the run (pi0's state token appends included)."""
    calls = run.engine.get("forwards.expert", 0.0)
    return (run.engine.get("forward_chunks.expert", 0.0) / calls if calls else float("nan"),
            run.engine.get("forward_rows.expert", 0.0) / calls if calls else float("nan"))


def prefix_batch(run: Served) -> tuple[float, float, float]:
    """(requests per PaliGemma forward, requests per SigLIP call, share of prefix rows the prefix cache supplied)."""
    forwards, calls = run.engine.get("forwards.lm", 0.0), run.nodes.get("vision.batches", 0.0)
    computed, hits = run.engine.get("forward_rows.lm", 0.0), run.engine.get("prefix_hit_tokens", 0.0)
    return (run.engine.get("forward_chunks.lm", 0.0) / forwards if forwards else float("nan"),
            run.nodes.get("vision.items", 0.0) / calls if calls else float("nan"),
            hits / (hits + computed) if hits + computed else float("nan"))


def merge(runs: list[Served]) -> Served:
    out = Served()
    for r in runs:
        out.latencies += r.latencies
        out.wall += r.wall
        out.requests += r.requests
        out.cpu += r.cpu
        for k, v in r.engine.items():
            out.engine[k] = out.engine.get(k, 0.0) + v
        for k, v in r.nodes.items():
            out.nodes[k] = out.nodes.get(k, 0.0) + v
    return out


@dataclass
class Workload:
    """One column's requests: the observations, as walkserve's processor and the reference take them."""

    obs: list[dict]
    prepared: list
    reference: list


def workload(files, args, seed: int, concurrency: int) -> Workload:
    """Fresh observations per column and round (so no column finds another's prefixes in walkserve's cache)."""
    from walkserve.models.pi0.inputs import InputSpec, validate_inputs
    from walkserve.models.pi0.request import prepare_request
    from walkserve.testing.pi0_reference import reference_inputs

    config = files.config
    obs = observations(args.requests, config.chunk_size, config.image_resolution[0], seed, concurrency, args.repeats)
    prepared = [prepare_request(files, validate_inputs(InputSpec.from_config(config), o)) for o in obs]
    return Workload(obs, prepared, [reference_inputs(config, p, device=args.device) for p in prepared])


async def _measure(path: Path, args) -> dict:
    import torch

    from walkserve.core.config import RuntimeConfig
    from walkserve.core.sampling import SamplingParams
    from walkserve.entrypoint.engine import AsyncEngine
    from walkserve.models.pi0.files import load_policy_files
    from walkserve.testing.pi0_reference import load_reference

    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    files = load_policy_files(path)
    config = files.config
    reference = load_reference(path, args.device)
    engine = await AsyncEngine.start("pi0", placement=placement(path, args.device), model_path=str(path),
                                     config=RuntimeConfig(worker_threads=args.threads, status_interval_s=0.05))
    try:
        processor = engine.processor
        specs = lambda w: [processor.build_request("act", {"inputs": o}, SamplingParams(),  # noqa: E731
                                                   processor.check_params({})) for o in w.obs]
        warm = workload(files, args, 1000, 1)
        reference_run(reference, warm.reference[:2], 1)  # warm-up both
        await served_run(engine, specs(warm)[:2], 1)
        runs: dict[str, list[Served]] = {"ref1": [], "ws1": [], "refC": [], "wsC": []}
        for r in range(args.rounds):
            one, many = workload(files, args, 2 * r, 1), workload(files, args, 2 * r + 1, args.concurrency)
            runs["ref1"].append(reference_run(reference, one.reference, 1))
            runs["ws1"].append(await served_run(engine, specs(one), 1))
            runs["refC"].append(reference_run(reference, many.reference, args.concurrency))
            runs["wsC"].append(await served_run(engine, specs(many), args.concurrency))
        prefix = reference_prefix_s(reference, one.reference)
        floor = prefix_floor(path, one.prepared, config, args.concurrency)
    finally:
        await engine.shutdown(drain_s=0)
    prompt = sum(len(p.token_ids) for p in one.prepared) / len(one.prepared)
    return {"config": config, "prefix_ref_ms": 1e3 * prefix, "load": (load, os.getloadavg()[0]), "prompt": prompt,
            "floor": floor,
            "gemm": max(gemm_rate(512, config.paligemma.hidden_size, 2 * config.paligemma.intermediate_size),
                        gemm_rate(512, config.paligemma.intermediate_size, config.paligemma.hidden_size)),
            **{k: merge(v) for k, v in runs.items()}}


def placement(path: Path, device: str) -> dict:
    """pi0's default placement (every node on rank 0) on ``device`` (``cuda`` means cuda:0)."""
    from walkserve.models.base import ModelRef
    from walkserve.models.pi0.model import RobotPolicy

    data = RobotPolicy(ModelRef("pi0", str(path))).default_placement()
    for rank in data["ranks"]:
        rank["device"] = "cuda:0" if device == "cuda" else device
    return data


def report(m: dict, args) -> str:
    c = m["config"]
    ref1, ws1, refc, wsc = m["ref1"], m["ws1"], m["refC"], m["wsC"]
    conc = args.concurrency
    lat = lambda r, q: 1e3 * pct(r.latencies, q)  # noqa: E731
    rate = lambda r: r.requests / r.wall if r.wall else float("nan")  # noqa: E731
    rows = []
    for name, one, many in (("transformers PI0 (one at a time)", ref1, refc), ("walkserve", ws1, wsc)):
        rows.append([name, lat(one, 0.5), lat(one, 0.95), rate(one), lat(many, 0.5), lat(many, 0.95), rate(many)])
    p50_ratio = lat(ws1, 0.5) / lat(ref1, 0.5)
    p95_ratio = lat(ws1, 0.95) / lat(ref1, 0.95)
    throughput = rate(wsc) / rate(refc)
    ws_split1, ws_splitc = split_ms(ws1), split_ms(wsc)
    ref_flow = lat(ref1, 0.5) - m["prefix_ref_ms"]
    b1, bc = expert_batch(ws1), expert_batch(wsc)
    p1, pc = prefix_batch(ws1), prefix_batch(wsc)
    lines = [
        f"pi0 action chunks, preset {args.preset}: PaliGemma {c.paligemma.hidden_size}x{c.paligemma.num_hidden_layers}, "
        f"expert {c.expert.hidden_size}x{c.expert.num_hidden_layers}, SigLIP {c.vision.hidden_size}x"
        f"{c.vision.num_hidden_layers} at {c.vision.image_size} px, {len(CAMERAS)} cameras ({c.image_tokens} tokens "
        f"each), horizon {c.chunk_size}, {c.num_inference_steps} flow steps, float32 on {args.device}; {args.requests} requests x "
        f"{args.rounds} rounds per column; each robot's observation changes every {args.repeats} chunk(s); "
        f"{conditions(args.device)}",
        "",
        table(["system", "c=1 p50 ms", "c=1 p95 ms", "c=1 chunks/s", f"c={conc} p50 ms", f"c={conc} p95 ms",
               f"c={conc} chunks/s"], rows),
        "",
        f"- concurrency 1: p50 {p50_ratio:.2f}x, p95 {p95_ratio:.2f}x the reference's latency (target <= 1.1x)",
        f"- concurrency {conc}: {throughput:.2f}x the reference's chunks per second (target >= 3x)",
        f"- phase split per request, c=1: reference prefix {m['prefix_ref_ms']:.1f} ms, flow {ref_flow:.1f} ms; "
        f"walkserve compute prefix {ws_split1['prefix']:.1f} ms, flow {ws_split1['flow']:.1f} ms "
        f"(the rest of its {lat(ws1, 0.5):.1f} ms is the runtime's own work); c={conc}: walkserve prefix "
        f"{ws_splitc['prefix']:.1f} ms, flow {ws_splitc['flow']:.1f} ms per request",
        f"- expert batch: {b1[0]:.2f} requests ({b1[1]:.0f} rows) per expert call at c=1, {bc[0]:.2f} requests "
        f"({bc[1]:.0f} rows) at c={conc} (one call per flow step for every request in the loop)",
        f"- prefix batch: {p1[0]:.2f} requests per PaliGemma forward, {p1[1]:.2f} per SigLIP call at c=1; "
        f"{pc[0]:.2f} and {pc[1]:.2f} at c={conc}; prefix rows from the prefix cache: {100 * p1[2]:.0f}% at c=1, "
        f"{100 * pc[2]:.0f}% at c={conc}",
        *arithmetic(m, conc, args.repeats),
        f"- conditions: walkserve's one worker and the reference use the same thread count and never run at the "
        f"same time; load average {m['load'][0]:.2f} before, {m['load'][1]:.2f} after (on a shared machine rerun "
        f"for figures to quote)",
    ]
    return "\n".join(lines)


def arithmetic(m: dict, conc: int, repeats: int = 1) -> list[str]:
    """CPU time per chunk (less skewed by a shared machine than wall time), FLOPs per chunk, and the throughput
    ratio this machine's best matmul rate allows at most (when every chunk computes its whole prefix)."""
    c, cameras = m["config"], len(CAMERAS)
    ws = chunk_flops(c, cameras, round(m["prompt"]), kv_only=True)
    ref = chunk_flops(c, cameras, round(m["prompt"]), kv_only=False, vision_slots=len(c.cameras))
    per = lambda r: 1e3 * r.cpu / max(r.requests, 1)  # noqa: E731
    ref_ms, ws1_ms, wsc_ms = per(m["ref1"]), per(m["ws1"]), per(m["wsC"])
    floor_ms = sum(ws.values()) / m["gemm"] / 1e6
    whole = "" if repeats == 1 else " (were every prefix computed; here the caches skip the unchanged ones)"
    gf = lambda f: "/".join(f"{v / 1e9:.2f}" for v in f.values())  # noqa: E731
    return [
        f"- CPU time per chunk: reference {ref_ms:.0f} ms, walkserve {ws1_ms:.0f} ms at c=1 and {wsc_ms:.0f} ms at "
        f"c={conc} (worker and client processes): {ref_ms / wsc_ms:.2f}x the reference's chunks per CPU second",
        f"- arithmetic per chunk (vision/prefix/flow GFLOP): walkserve {gf(ws)} = {sum(ws.values()) / 1e9:.2f}, the "
        f"reference {gf(ref)} = {sum(ref.values()) / 1e9:.2f} (every camera slot through SigLIP, the last layer's "
        f"tail); the reference runs at {sum(ref.values()) / ref_ms / 1e6:.1f} GFLOP per CPU second, walkserve at c={conc} "
        f"{sum(ws.values()) / wsc_ms / 1e6:.1f}{whole}; this thread's best float32 matmul {m['gemm']:.1f} GFLOP/s, so a "
        f"chunk takes >= {floor_ms:.0f} ms of CPU and the throughput ratio is at most {ref_ms / floor_ms:.2f}x{whole}",
        f"- the prefix does not batch away: walkserve's own vision + PaliGemma take {1e3 * m['floor'][0]:.0f} ms of CPU "
        f"a request offline (the vision of {conc} requests' cameras in one call: {1e3 * m['floor'][1]:.0f} ms a request),"
        f" so even with a free flow the throughput ratio is at most {ref_ms / (1e3 * m['floor'][0]):.2f}x{whole}",
    ]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="./dev bench pi", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the tiny preset, few requests: a smoke run (< 60 s)")
    p.add_argument("--preset", choices=["tiny", "bench"], default=None, help="checkpoint sizes (default: bench)")
    p.add_argument("--requests", type=int, default=None, help="requests per column and round (default 16; quick 8)")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 2; quick 1)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=1,
                   help="chunks each robot asks for one observation before it changes (default 1: every chunk new)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (both systems on that device; default cpu)")
    args = p.parse_args(argv)
    args.preset = args.preset or ("tiny" if args.quick else "bench")
    args.requests = args.requests or (8 if args.quick else 16)
    args.rounds = args.rounds or (1 if args.quick else 2)
    from walkserve.models.pi0.tiny import write_tiny_policy

    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_policy("pi0", Path(tmp) / f"pi0-{args.preset}", seed=0, preset=args.preset)
        measured = asyncio.run(_measure(path, args))
    print(report(measured, args))
    return 0
