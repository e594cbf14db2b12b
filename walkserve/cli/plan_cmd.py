"""``walkserve plan`` and ``walkserve profile``: placements chosen from measured node costs, memory and the workload.

    walkserve profile orpheus --model-path DIR                     # measure node costs once (cached)
    walkserve plan orpheus --model-path DIR --devices cpu:0,cpu:1 -o placement.yaml
    walkserve plan orpheus --model-path DIR --explain my-placement.yaml
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from walkserve.core.errors import ConfigError
from walkserve.core.proc import usable_cores


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", metavar="MODEL", help="model family (orpheus, qwen3-omni, ...) or auto")
    p.add_argument("--model-path", metavar="DIR", help="checkpoint directory")
    p.add_argument("--snac-path", metavar="DIR", help="orpheus: the SNAC codec directory")
    p.add_argument("--workload", metavar="FILE", help="request mix (YAML: kinds with weights; default: the family's)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="weights dtype (default: the model's)")
    p.add_argument("--profile-cache", metavar="DIR", type=Path, help="where profiles are cached "
                   "(default: $WALKSERVE_CACHE_DIR/profiles)")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="choose a placement from measured node costs, memory and the workload",
                       description="Enumerate the placements that fit the devices, score each with the measured node "
                       "costs and the workload, and write the best; or score a placement file (--explain).")
    _model_args(p)
    p.add_argument("--devices", metavar="SPEC", help="cpu:0,cpu:1 | cuda:0-7 | cuda:0-2@141GiB | a YAML file of "
                   "{device, memory, host, cores}")
    p.add_argument("--objective", choices=["throughput", "ttfa"], default="throughput")
    p.add_argument("--slo", action="append", metavar="NAME=VALUE", help="ttfa=SECONDS or throughput=REQ_PER_S (repeatable)")
    p.add_argument("-o", "--output", metavar="FILE", help="write the winning placement here")
    p.add_argument("--explain", metavar="PLACEMENT", help="score this placement file instead of searching")
    p.add_argument("--top", type=int, default=5, metavar="N", help="candidates to print (default: %(default)s)")
    p.add_argument("--no-profile", action="store_true", help="fail when no cached profile exists instead of profiling")
    p.add_argument("--shapes", choices=["checkpoint", "released"], help="predict step costs from shapes (FLOPs and "
                   "bytes per node against a GPU's peak rates) instead of profiling: the --model-path checkpoint's "
                   "shapes, or the released model's (header-only weights, written once under the cache)")
    p.add_argument("--gpu", choices=["h100", "h200"], help="with --shapes: the GPU's peak rates (default: by "
                   "the devices' memory, over 100 GiB an H200)")
    p.add_argument("--jobs", type=int, default=usable_cores(), metavar="N",
                   help="processes that score the candidates of a long search (default: the cores this process may "
                   "use, %(default)s)")
    p.add_argument("--scorer", choices=["simulate", "bound"], default="simulate",
                   help="simulate each candidate (default) or use the analytical bottleneck bound")
    p.set_defaults(func=run_plan)
    q = sub.add_parser("profile", help="measure each node's step cost (cached for walkserve plan)")
    _model_args(q)
    q.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="device kind to profile on")
    q.add_argument("--repeats", type=int, default=2, metavar="N", help="runs per concurrency (default: %(default)s)")
    q.set_defaults(func=run_profile)


def _load_model(args: argparse.Namespace):
    from walkserve.cli.serve_target import resolve_target
    from walkserve.models.registry import load_model
    from walkserve.planner.workload import default_workload, load_workload

    target = resolve_target(args.model, args.model_path, args.snac_path)
    model = load_model(target.ref())
    workload = load_workload(args.workload) if args.workload else default_workload(model.ref.family, model.processor())
    return model, workload


def _load(workload) -> str:
    return f"{workload.rate:g} requests/s arriving" if workload.rate else f"{workload.concurrency} requests at once"


def _how(scorer: str) -> str:
    return "simulated" if scorer == "simulate" else "analytical bound"


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_profile(args: argparse.Namespace) -> int:
    from walkserve.planner.planning import costs_for

    model, workload = _load_model(args)
    table = costs_for(model, workload, args.device, args.dtype, args.profile_cache, True, _progress, args.repeats)
    for node, cost in sorted(table.nodes.items()):
        print(f"{node}: {table.items_per_request.get(node, 0):.1f} items/request; {_fits(cost)}")
    alike: dict[tuple, int] = {}  # (kind, items) -> requests that made them
    for req in table.requests:
        key = (req.kind, tuple(sorted(req.items.items())))
        alike[key] = alike.get(key, 0) + 1
    for (kind, items), n in alike.items():
        made = ", ".join(f"{name} {v:g}" for name, v in items)
        print(f"{n} of the first {len(table.requests)} requests ({kind}), each alone: {made} items")
    if table.loop.samples:
        print(f"a rank's loop outside its steps, per step: {_fits(table.loop)}")
    print(f"frontend (conductor and client): {table.frontend_s * 1e3:.2f} ms CPU/request; "
          f"a message between ranks: {table.hop_s * 1e3:.3f} ms")
    busy = ", ".join(f"{t} thread(s) {c:.2f}" for t, c in sorted(table.worker_cpu.items()))
    print(f"host: {table.cores or 'unrecorded'} cores; cores a worker wants while active: {busy or 'unmeasured'}")
    return 0


def _fits(cost) -> str:
    return ", ".join(f"{t} thread(s): {f * 1e3:.2f} ms + {p * 1e3:.3f} ms/item"
                     for t in sorted(cost.samples) for f, p in [cost.fit(t)])


def run_plan(args: argparse.Namespace) -> int:
    from walkserve.planner import planning
    from walkserve.planner.devices import parse_devices

    if args.shapes:
        return _plan_from_shapes(args)
    model, workload = _load_model(args)
    if args.explain:
        return _explain(args, model, workload)
    if not args.devices:
        raise ConfigError("walkserve plan needs --devices (e.g. cpu:0,cpu:1 or cuda:0-7), or --explain FILE")
    devices = parse_devices(args.devices)
    kinds = {d.kind for d in devices}
    planning.require_fit(model, devices)  # before a profile that could take minutes
    table = planning.costs_for(model, workload, min(kinds), args.dtype, args.profile_cache, not args.no_profile, _progress)
    _report(args, model, devices, table, workload, "the measured node costs")
    return 0


def _plan_from_shapes(args: argparse.Namespace) -> int:
    from walkserve.core import env
    from walkserve.planner import planning, shapes
    from walkserve.planner.devices import parse_devices
    from walkserve.planner.workload import load_workload

    if not args.devices:
        raise ConfigError("walkserve plan --shapes needs --devices (e.g. cuda:0-7@80GiB)")
    devices = parse_devices(args.devices)
    if any(d.kind != "cuda" for d in devices):
        raise ConfigError("--shapes predicts GPU steps: give cuda devices (e.g. cuda:0-2@141GiB)")
    if args.shapes == "released":
        model = shapes.released_model(args.model or "", env.WALKSERVE_CACHE_DIR.get() / "released")
        workload = shapes.RELEASED_WORKLOADS[model.ref.family]
        workload = load_workload(args.workload) if args.workload else workload
    else:
        model, workload = _load_model(args)
    planning.require_fit(model, devices)
    gpu = shapes.gpu_for(max(d.memory or 0 for d in devices), args.gpu)
    table = shapes.costs_from_shapes(model, workload, gpu)
    _report(args, model, devices, table, workload, f"shapes against {gpu.name} peak rates: PREDICTED, NOT MEASURED")
    return 0


def _report(args: argparse.Namespace, model, devices, table, workload, source: str) -> None:
    from walkserve.planner import planning

    result = planning.plan(model, devices, table, workload, args.objective, planning.parse_slo(args.slo), args.scorer,
                           _progress, args.jobs)
    print(f"{result.considered} placements fit {args.devices} (workload {workload.name}, {_load(workload)}); "
          f"predicted ({_how(args.scorer)}) from {source}, best for {args.objective} first:")
    for i, c in enumerate(result.ranked[: args.top]):
        print(f"  {i + 1}. {planning.summary(c)}")
    print(f"winner: {result.winner.name}\nwhy: {result.why}")
    if args.output:
        header = [f"walkserve plan {model.ref.family} --devices {args.devices} --objective {args.objective}",
                  f"workload {workload.name}; costs from {source}", f"why: {result.why}"]
        Path(args.output).write_text(planning.placement_yaml(result.winner, header))
        print(f"wrote {args.output}")


def _explain(args: argparse.Namespace, model, workload) -> int:
    import yaml

    from walkserve.cli.placement_arg import placement_path
    from walkserve.planner import planning
    from walkserve.planner.devices import host_cores, parse_devices

    path = placement_path(args.explain)
    data = yaml.safe_load(path.read_text())
    kinds = {"cpu" if r.get("device") == "cpu" else "cuda" for r in data.get("ranks") or [] if isinstance(r, dict)}
    table = planning.costs_for(model, workload, min(kinds or {"cpu"}), args.dtype, args.profile_cache,
                               not args.no_profile, _progress)
    cores = host_cores(parse_devices(args.devices)) if args.devices else None  # a devices file's cores per host
    c = planning.explain(model, data, str(path), table, workload.load, args.scorer, cores)
    print(f"{path} (workload {workload.name}, {_load(workload)}), predicted ({_how(args.scorer)}): {planning.summary(c)}")
    for rank, busy in sorted(c.score.rank_busy.items()):
        parts = ", ".join(f"{u} {s * 1000:.1f} ms" for u, s in sorted(c.score.unit_busy.get(rank, {}).items()))
        print(f"  rank {rank}: {busy * 1000:.1f} ms/request busy ({parts or 'idle'})")
    return 0
