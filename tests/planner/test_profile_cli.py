"""A real profile of tiny Orpheus through the runtime, and the plan / profile / serve --placement auto commands."""

import os

import pytest

from tests.planner.conftest import table
from walkserve.cli.main import main
from walkserve.placement.plan import load_placement
from walkserve.planner.costs import CostTable, RequestItems, cache_key, cache_path
from walkserve.planner.profile import profile
from walkserve.planner.workload import RequestKind, Workload


@pytest.mark.slow  # starts the runtime (through walkserve.planner.profile, which tests/tiers.py does not follow)
def test_profile_measures_every_node_through_the_runtime(orpheus):
    work = Workload((RequestKind("speech", 1.0, "speech", {"input": "Hello {i}."}, 29),), 2)
    t = profile(orpheus, work, "k", threads=(1,), concurrencies=(1, 2), repeats=1)
    assert set(t.nodes) == {"lm", "codec"}
    # 29 audio tokens (ignore_eos): the LM fires for every token (its prefill too); the codec once per window
    assert t.items_per_request["lm"] >= 29
    assert 1 <= t.items_per_request["codec"] < t.items_per_request["lm"]
    # the workload's first requests, each alone: one kind, every one the same items as the mean
    assert len(t.requests) == 16 and {r.kind for r in t.requests} == {"speech"}
    assert all(r.items == pytest.approx(t.items_per_request) for r in t.requests)
    for cost in t.nodes.values():
        assert cost.step_seconds(1.0, 1) > 0
        assert {c for c, _, _ in cost.samples[1]} == {1, 2}
    assert t.first_output_s[1] > 0
    # the worker's loop outside its steps, per step, and the frontend's CPU per request: small beside the steps
    assert 0 < t.loop_seconds(1.0, 1) < t.nodes["codec"].step_seconds(1.0, 1)
    assert {c for c, _, _ in t.loop.samples[1]} == {1, 2}
    assert 0 < t.frontend_s < 1.0
    if (os.cpu_count() or 1) >= 2:  # a core for each group: the stage run, lm and codec on ranks of their own
        assert t.hop_s != CostTable("k").hop_s and 0 < t.hop_s < 0.05  # measured: the sender's seconds a message


def _seed(orpheus, tmp_path, costs: CostTable) -> None:
    key = cache_key("orpheus", orpheus.ref.path, "cpu", "model", dict(orpheus.ref.options), "default")
    costs.key = key
    costs.save(cache_path(key, tmp_path))


def test_plan_command_writes_a_placement_and_explains_one(orpheus, orpheus_dir, tmp_path, capsys):
    _seed(orpheus, tmp_path, table(0.01, 0.02, lm_fixed=True))
    out = tmp_path / "p.yaml"
    base = ["orpheus", "--model-path", str(orpheus_dir), "--profile-cache", str(tmp_path), "--no-profile"]
    assert main(["plan", *base, "--devices", "cpu:0,cpu:1", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "winner: [lm] | [codec]" in text and "why:" in text
    placed = load_placement(out)
    assert len(placed.ranks) == 2
    assert main(["plan", *base, "--explain", "orpheus-colocated"]) == 0
    text = capsys.readouterr().out
    assert "rank 0:" in text and "lm" in text and "codec" in text


def test_profile_command_prints_the_costs_outside_the_steps(orpheus, orpheus_dir, tmp_path, capsys):
    costs = table(0.01, 0.02)
    costs.loop.add(1, 4, 4.0, 3e-4)
    costs.frontend_s = 2.5e-3
    costs.requests = [RequestItems("speech", {"lm": 64.0, "codec": 7.0})]
    _seed(orpheus, tmp_path, costs)  # cached: the command prints it without profiling
    assert main(["profile", "orpheus", "--model-path", str(orpheus_dir), "--profile-cache", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "lm: 64.0 items/request; 1 thread(s): " in out
    assert "1 of the first 1 requests (speech), each alone: codec 7, lm 64 items" in out
    assert "loop outside its steps, per step: 1 thread(s): 0.30 ms" in out
    assert "frontend (conductor and client): 2.50 ms CPU/request; a message between ranks: 0.100 ms" in out


def test_plan_without_a_profile_and_without_devices_fails_clearly(orpheus_dir, tmp_path, capsys):
    base = ["orpheus", "--model-path", str(orpheus_dir), "--profile-cache", str(tmp_path)]
    assert main(["plan", *base]) == 1
    assert "needs --devices" in capsys.readouterr().err
    assert main(["plan", *base, "--no-profile", "--devices", "cpu:0"]) == 1
    assert "walkserve profile orpheus" in capsys.readouterr().err


def test_placement_auto_plans_at_start_up(orpheus, tmp_path, monkeypatch):
    from walkserve.planner.planning import auto_placement

    _seed(orpheus, tmp_path, table(0.01, 0.02, lm_fixed=True))
    said = []
    path = auto_placement(orpheus, "cpu:0,cpu:1", None, tmp_path / "plans", said.append, cache_dir=tmp_path)
    placed = load_placement(path)
    assert len(placed.ranks) == 2
    assert any("placement auto on cpu:0,cpu:1" in s for s in said)


def test_serve_rejects_devices_without_auto(orpheus_dir, capsys):
    assert main(["serve", "orpheus", "--model-path", str(orpheus_dir), "--devices", "cpu:0", "--port", "0"]) == 1
    assert "--placement auto" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--config", "--placement"])
def test_serve_takes_placement_auto(flag):
    from walkserve.cli.main import build_parser

    args = build_parser().parse_args(["serve", "orpheus", flag, "auto", "--devices", "cpu:0,cpu:1"])
    assert (args.config, args.devices) == ("auto", "cpu:0,cpu:1")


def _too_small(orpheus) -> int:
    """A CPU budget that holds the LM and its KV pool, or the codec, but not both."""
    from walkserve.placement.memory import DEFAULT_CPU_KV_BYTES

    comps = orpheus.components()
    return comps["lm"].weight_bytes + DEFAULT_CPU_KV_BYTES + comps["codec"].weight_bytes - 1


def test_too_few_devices_name_the_smallest_set_before_any_profile(orpheus, orpheus_dir, tmp_path, capsys):
    cache = tmp_path / "profiles"
    base = ["orpheus", "--model-path", str(orpheus_dir), "--profile-cache", str(cache)]
    assert main(["plan", *base, "--devices", f"cpu:0@{_too_small(orpheus)}"]) == 1
    err = capsys.readouterr().err
    assert "does not fit on 1 device(s)" in err and "the smallest device set that holds it: 2 x cpu" in err
    assert "profile:" not in err and not cache.exists()  # refused from the memory alone, nothing profiled


def test_placement_auto_refuses_too_few_devices_before_profiling(orpheus, tmp_path):
    from walkserve.core.errors import PlacementError
    from walkserve.planner.planning import auto_placement

    said = []
    with pytest.raises(PlacementError, match=r"smallest device set that holds it: 2 x cpu"):
        auto_placement(orpheus, f"cpu:0@{_too_small(orpheus)}", None, tmp_path / "plans", said.append,
                       cache_dir=tmp_path / "profiles")
    assert said == [] and not (tmp_path / "profiles").exists()


@pytest.mark.slow  # profiles through the runtime
def test_placement_auto_from_a_fresh_state_profiles_then_plans(orpheus, tmp_path):
    from walkserve.planner.planning import auto_placement

    said = []
    path = auto_placement(orpheus, "cpu:0,cpu:1", None, tmp_path / "plans", said.append, cache_dir=tmp_path / "cache")
    assert any(s.startswith("profile: starting orpheus") for s in said)  # the quick profile shows its progress
    assert any("placement auto on cpu:0,cpu:1" in s for s in said) and any(s.startswith("why:") for s in said)
    assert len(list((tmp_path / "cache").glob("*.json"))) == 1  # cached: the next start plans at once
    placed = load_placement(path)
    assert {r.device for r in placed.ranks.values()} == {"cpu"}
    assert "predicted" in path.read_text()
    again = []
    auto_placement(orpheus, "cpu:0,cpu:1", None, tmp_path / "plans", again.append, cache_dir=tmp_path / "cache")
    assert not any(s.startswith("profile:") for s in again)
