"""Step costs predicted from shapes (a roofline per node), and ``walkserve plan --shapes`` on tiny Qwen3-Omni."""

import pytest
import yaml

from walkserve.cli.main import main
from walkserve.placement.plan import load_placement
from walkserve.planner.shapes import (
    GPUS,
    LAUNCH_S,
    MBU,
    MFU,
    PROMPT_TOKENS,
    VIT_TOKENS,
    UnitShape,
    bagel_items,
    gpu_for,
    qwen3_omni_items,
    shape_table,
)
from walkserve.planner.workload import RequestKind, Workload

H100 = GPUS["h100"]


def test_a_step_is_bound_by_bandwidth_at_small_batches_and_by_flops_at_large():
    lm = UnitShape("lm", dense_bytes=14e9, flops_per_token=14e9)  # a 7B dense LM in bf16
    one = lm.step_seconds(1, H100)
    assert one == pytest.approx(LAUNCH_S + 14e9 / (H100.bandwidth * MBU))  # reading the weights once
    big = lm.step_seconds(4096, H100)
    assert big == pytest.approx(LAUNCH_S + 4096 * 14e9 / (H100.flops * MFU))  # compute-bound
    assert lm.step_seconds(8, H100) == pytest.approx(one)  # a small batch rides on the same weight read


def test_experts_cost_bytes_in_proportion_to_those_a_batch_touches():
    moe = UnitShape("moe", dense_bytes=0.0, expert_bytes=64e9, topk_share=8 / 128)
    t1, t64 = (moe.step_seconds(b, H100) - LAUNCH_S for b in (1, 64))
    assert t1 == pytest.approx(64e9 * 8 / 128 / (H100.bandwidth * MBU))
    assert t64 == pytest.approx(64e9 * (1 - (1 - 8 / 128) ** 64) / (H100.bandwidth * MBU))  # almost every expert
    table = shape_table("k", [moe], {"moe": 10.0}, H100)
    assert table.nodes["moe"].step_seconds(1, 1) > 0 and table.items_per_request == {"moe": 10.0}


def test_gpu_from_the_memory_budget():
    assert gpu_for(80 << 30) is GPUS["h100"] and gpu_for(141 << 30) is GPUS["h200"]
    assert gpu_for(80 << 30, "h200") is GPUS["h200"]


def test_qwen3_omni_items_follow_the_mix():
    spoken = RequestKind("s", 3, "chat", {"modalities": ["text", "audio"]}, 20, {"max_audio_frames": 50})
    text = RequestKind("t", 1, "chat", {"modalities": ["text"]}, 40)
    items = qwen3_omni_items(Workload((spoken, text), 4))
    assert items["thinker"] == pytest.approx(0.75 * 20 + 0.25 * 40)
    assert items["talker"] == pytest.approx(0.75 * 52)
    assert items["code_predictor"] == pytest.approx(0.75 * 15 * 50)
    assert items["frame"] == items["predictor_in"] == items["talker_in"] == pytest.approx(0.75 * 50)
    assert items["code2wav"] == pytest.approx(0.75 * 2)  # 50 frames: two chunks of 25


@pytest.fixture(scope="module")
def omni_dir(tmp_path_factory):
    from walkserve.models.qwen3_omni.tiny import write_tiny_qwen3_omni

    return write_tiny_qwen3_omni(tmp_path_factory.mktemp("shapes_omni"), seed=0, speech=True)


def test_plan_from_the_checkpoints_shapes_on_gpus(omni_dir, tmp_path, capsys):
    out = tmp_path / "p.yaml"
    base = ["plan", "qwen3-omni", "--model-path", str(omni_dir), "--shapes", "checkpoint"]
    assert main([*base, "--devices", "cuda:0-1@4GiB", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "PREDICTED, NOT MEASURED" in text and "H100" in text and "winner:" in text
    placed = load_placement(out)
    assert {r.device for r in placed.ranks.values()} <= {"cuda:0", "cuda:1"}
    assert "PREDICTED, NOT MEASURED" in out.read_text()
    nodes = {n for entry in yaml.safe_load(out.read_text())["nodes"] for n in entry["nodes"]}
    assert {"thinker", "talker", "code_predictor", "code2wav"} <= nodes  # the speech path is placed
    assert main([*base, "--devices", "cpu:0,cpu:1"]) == 1
    assert "give cuda devices" in capsys.readouterr().err


def test_shape_tables_give_each_request_its_kinds_items_so_the_talkers_loop_closes(omni_dir):
    # the mix's mean (9.6 frames, 144 code-predictor steps a request) does not close the talker's loop: the
    # simulation released some 2,000 items without their inputs; a spoken answer's own 18 / 240 / 16 do
    from walkserve.models.base import ModelRef
    from walkserve.models.registry import load_model
    from walkserve.placement.plan import parse_placement
    from walkserve.planner.flow import build_flow
    from walkserve.planner.shapes import costs_from_shapes
    from walkserve.planner.simulate import Simulation
    from walkserve.planner.workload import default_workload

    model = load_model(ModelRef("qwen3-omni", str(omni_dir)))
    workload = default_workload("qwen3-omni", model.processor())
    table = costs_from_shapes(model, workload, H100)
    kinds = [r.kind for r in table.requests]
    assert kinds == [k.name for k in workload.mix(len(kinds))] and len(kinds) >= 10
    spoken = next(r for r in table.requests if r.kind == "spoken")
    assert (spoken.items["talker"], spoken.items["code_predictor"], spoken.items["frame"]) == (18, 240, 16)
    assert "talker" not in next(r for r in table.requests if r.kind == "text").items
    graph, comps = model.graph(), model.components()
    one_rank = parse_placement({"ranks": [{"id": 0, "device": "cuda:0"}],
                                "nodes": [{"nodes": graph.node_names(), "ranks": [0]}]}, "one.yaml")
    sim = Simulation(table, build_flow(table, graph, comps), graph, one_rank, workload.load, None)
    assert sim.run().throughput > 0 and sim.forced == 0


def test_bagel_items_follow_the_mix():
    gen = RequestKind("g", 1, "image", {"prompt": "x"}, 1, {"num_timesteps": 11})
    und = RequestKind("u", 1, "chat", {}, 20)
    items, tokens = bagel_items(Workload((gen, und), 2), rows=4098)
    assert items["lm"] == pytest.approx(0.5 * (4 + 3 * 10) + 0.5 * (3 + 20))  # prefills, 3 passes a step; answer
    assert items["velocity"] == items["cfg_step"] == pytest.approx(0.5 * 10)
    assert items["vit"] == items["vae_decoder"] == items["latent_init"] == pytest.approx(0.5)
    assert tokens == pytest.approx((0.5 * (2 * PROMPT_TOKENS + 30 * 4098) + 0.5 * (PROMPT_TOKENS + VIT_TOKENS + 20))
                                   / items["lm"])


def test_plan_bagel_from_its_shapes(tmp_path, capsys):
    from walkserve.models.bagel.tiny import write_tiny_bagel

    path = write_tiny_bagel(tmp_path / "bagel")
    wl = tmp_path / "w.yaml"
    wl.write_text("concurrency: 2\nkinds:\n  - {name: g, task: image, payload: {prompt: hi}, max_tokens: 1,"
                  " params: {num_timesteps: 6}}\n")
    argv = ["plan", "bagel", "--model-path", str(path), "--shapes", "checkpoint", "--workload", str(wl),
            "--devices", "cuda:0-1@4GiB"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "PREDICTED, NOT MEASURED" in text and "mostly lm" in text  # the LLM's denoising passes dominate


@pytest.mark.slow  # spawns the scoring processes
def test_a_search_scored_in_several_processes_gives_the_same_candidates_in_the_same_order(omni_dir, monkeypatch):
    from walkserve.models.base import ModelRef
    from walkserve.models.registry import load_model
    from walkserve.planner import search
    from walkserve.planner.devices import parse_devices
    from walkserve.planner.shapes import costs_from_shapes
    from walkserve.planner.workload import default_workload

    model = load_model(ModelRef("qwen3-omni", str(omni_dir)))
    workload = default_workload("qwen3-omni", model.processor())
    table = costs_from_shapes(model, workload, H100)
    devices = parse_devices("cuda:0-2@4GiB")
    monkeypatch.setattr(search, "PARALLEL_AFTER_S", 0.0)  # the processes take over after the first split
    spawned = []
    real = search.in_processes
    monkeypatch.setattr(search, "in_processes", lambda *a: spawned.append(len(a[5])) or real(*a))
    runs = {}
    for jobs in (1, 2):
        rejected: list[str] = []
        cands = search.enumerate_candidates(model, devices, table, workload.load, rejected, jobs=jobs)
        runs[jobs] = ([(c.name, c.data, c.score) for c in cands], rejected)
    assert len(spawned) == 1 and spawned[0] > 10  # jobs=2 handed the splits after the first to the processes
    assert len(runs[1][0]) > 20 and runs[1] == runs[2]


def test_a_search_whose_processes_fail_goes_on_in_this_one_with_the_same_candidates(omni_dir, monkeypatch, caplog):
    from walkserve.models.base import ModelRef
    from walkserve.models.registry import load_model
    from walkserve.planner import search
    from walkserve.planner.devices import parse_devices
    from walkserve.planner.shapes import costs_from_shapes
    from walkserve.planner.workload import default_workload

    model = load_model(ModelRef("qwen3-omni", str(omni_dir)))
    workload = default_workload("qwen3-omni", model.processor())
    table = costs_from_shapes(model, workload, H100)
    devices = parse_devices("cuda:0-2@4GiB")
    alone = search.enumerate_candidates(model, devices, table, workload.load)

    def broken(model, devices, table, load, scorer, chains, jobs):  # gives two splits back, then its pool breaks
        probe = search.ChainSearch(model, devices, table, load, scorer)
        for assign in chains[:2]:
            yield probe.chain(assign)
        raise OSError("no processes here")

    monkeypatch.setattr(search, "PARALLEL_AFTER_S", 0.0)
    monkeypatch.setattr(search, "in_processes", broken)
    cands = search.enumerate_candidates(model, devices, table, workload.load, jobs=2)
    assert [(c.name, c.score) for c in cands] == [(c.name, c.score) for c in alone] and len(alone) > 20
    assert "scoring in 2 processes failed (OSError: no processes here)" in caplog.text
