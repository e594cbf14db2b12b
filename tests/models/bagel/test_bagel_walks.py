"""BAGEL's walks, state machine, processor checks and memory, without a runtime (fast).

The memory check runs on a header-only ``ema.safetensors`` / ``ae.safetensors`` with the released
model's shapes (built on the meta device from the released configs): 14B parameters, 7B active, KV
56 KiB per token, 4,098-row queries.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from walkserve.core.array import ArrayData
from walkserve.core.errors import InvalidRequest, PlacementError
from walkserve.core.sampling import SamplingParams
from walkserve.models.bagel.graph import PASS_NODES
from walkserve.models.bagel.machine import FLOW_UND
from walkserve.models.bagel.model import BagelModel
from walkserve.models.base import ModelRef
from walkserve.worker.local import local_level
from walkserve.worker.program import compile_program


@pytest.fixture(scope="module")
def model(tiny_dir) -> BagelModel:
    return BagelModel(ModelRef("bagel", str(tiny_dir)))


@pytest.fixture(scope="module")
def proc(model):
    return model.processor()


def image(h: int, w: int) -> ArrayData:
    return ArrayData("uint8", (h, w, 3), bytes(h * w * 3))


def walks_of(model, spec, plan: list[int] | None = None) -> list:
    machine, out = model.graph().state_machine, []
    start = machine.first(spec)
    while start is not None:
        out.append(start)
        outputs = {}
        if start.walk == "think":
            outputs["plan"] = ArrayData.from_list(plan or [], "int64")
        elif start.walk.startswith("image_gen"):
            outputs["latents"] = ArrayData("float32", (0,), b"")
        start = machine.next(spec, start.walk, outputs)
    return out


def test_each_flow_runs_its_walks_in_the_release_order(model, proc):
    greedy = SamplingParams(temperature=0.0, seed=1)
    t2i = proc.build_request("image", {"prompt": "a cat"}, greedy, proc.check_params({"size": [64, 32]}))
    assert [s.walk for s in walks_of(model, t2i)] == ["prefill_text", "image_gen", "vae_decode"]
    think = proc.build_request("image", {"prompt": "a cat", "modalities": ["latent"]}, greedy,
                               proc.check_params({"size": [64, 32], "think": True}))
    starts = walks_of(model, think, plan=[5, 6, 7])
    assert [s.walk for s in starts] == ["prefill_system", "prefill_text", "think", "image_gen_think_latents"]
    gen = starts[-1].inputs
    tokens = proc.tokens
    assert gen["plan_tokens"].tolist() == [tokens.im_start, 5, 6, 7, tokens.im_end]
    sys_len, prompt_len = (think.inputs[k].numel + 2 for k in ("system_token_ids", "prompt_token_ids"))
    assert gen["plan_length"].tolist() == [sys_len + prompt_len]  # gen rolled back to before the plan
    assert set(gen["positions"].tolist()) == {sys_len + prompt_len + 5}  # one shared position after the plan
    assert set(gen["positions_cfg_text"].tolist()) == {sys_len}  # cfg_text lacks the prompt
    assert set(gen["positions_cfg_img"].tolist()) == {sys_len + prompt_len}  # cfg_img lacks the plan
    edit = proc.build_request("image", {"prompt": "blue", "images": [image(30, 40)]}, greedy, proc.check_params({}))
    starts = walks_of(model, edit)
    assert [s.walk for s in starts] == ["prefill_vae", "prefill_vit_edit", "prefill_text", "image_gen", "vae_decode"]
    vae, vit = starts[0].inputs, starts[1].inputs
    n = vae["embed_rows"].numel
    assert vae["expert"].tolist() == [0] + [1] * n + [0] and set(vae["positions"].tolist()) == {0}
    assert set(vit["positions"].tolist()) == {1}  # each image block takes one position
    und = proc.build_request("chat", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "and?"}, {"type": "image", "image": image(20, 20)}, {"type": "image", "image": image(40, 20)}]}]},
        greedy, proc.check_params({"think": True}))
    assert und.params.flow == FLOW_UND
    assert [s.walk for s in walks_of(model, und)] == ["prefill_text_gen", "prefill_vit", "prefill_vit_2",
                                                      "prefill_text_gen_2", "decode"]


def _engine_calls(plan) -> list[tuple[str, ...]]:
    """The denoise step's node units on one rank, grouped by the engine call they share."""
    local = local_level(compile_program(plan), "denoise", frozenset(plan.nodes))
    calls, call = [], []
    for unit in local.units:
        call.append(unit.node.name)
        if not unit.joins_next:
            calls.append(tuple(call))
            call = []
    return calls


def test_the_three_guidance_passes_are_one_engine_call(model):
    graph = model.graph()
    for walk in ("image_gen", "image_gen_think", "image_gen_latents", "image_gen_think_latents"):
        calls = _engine_calls(graph.plans[walk])
        assert calls[0] == tuple(PASS_NODES.values()) and calls[-1] == ("cfg_step",)
    calls = _engine_calls(graph.plans["image_gen_think_latents_previews"])
    assert calls[0] == tuple(PASS_NODES.values()) and calls[-2:] == [("cfg_step",), ("preview",)]


@pytest.mark.parametrize(("task", "payload", "params", "param"), [
    ("image", {"prompt": "x", "images": [image(20, 20), image(20, 20)]}, {}, "image"),
    ("image", {"prompt": "x", "images": [image(20, 20)]}, {"size": "64x64"}, "size"),
    ("image", {"prompt": ""}, {}, "prompt"),
    ("image", {"prompt": "x"}, {"steps": 9, "num_timesteps": 10}, "steps"),
    ("image", {"prompt": "x", "modalities": ["audio"]}, {}, "modalities"),
    ("image", {"prompt": "x", "noise": ArrayData.from_list([1.0] * 64, "float32")}, {"size": "32x32"}, "noise"),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "image", "image": image(8, 8)}] * 5 +
                            [{"type": "text", "text": "x"}]}]}, {}, "messages"),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "image", "image": ArrayData.from_list([1], "int64")},
                                                        {"type": "text", "text": "x"}]}]}, {}, "messages[0].content[0]"),
    ("generate", {"inputs": {"prompt": "x", "mask": 1}, "modalities": ["image"]}, {}, "inputs.mask"),
])
def test_requests_it_cannot_take_are_refused_naming_the_field(proc, task, payload, params, param):
    with pytest.raises(InvalidRequest) as e:
        proc.build_request(task, payload, SamplingParams(), proc.check_params(params))
    assert e.value.param == param


def test_unknown_and_out_of_range_parameters_are_refused_where_they_enter(proc):
    for params, param in (({"guidance": 2}, "guidance"), ({"cfg_renorm_min": 2}, "cfg_renorm_min")):
        with pytest.raises(InvalidRequest) as e:
            proc.build_request("image", {"prompt": "x"}, SamplingParams(), proc.check_params(params))
        assert e.value.param == param


# ---- the released sizes ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def released(tmp_path_factory) -> Path:
    from walkserve.models.bagel.release import write_release

    out = tmp_path_factory.mktemp("released")
    write_release(out)
    return out


def test_the_released_sizes(released):
    from walkserve.models.bagel.config import BagelConfig
    from walkserve.models.bagel.memory import (
        default_max_batch_tokens,
        kv_bytes_per_token,
        parameter_counts,
        query_rows,
        weight_bytes,
    )

    config = BagelConfig.from_dir(released)
    total, active = parameter_counts(released)
    assert 14.0e9 < total < 15.0e9 and 7.0e9 < active < 8.0e9  # "14B total, 7B active"
    assert kv_bytes_per_token(config.llm) == 56 * 1024
    assert query_rows(config) == 4098 and default_max_batch_tokens(config) == 3 * 4098
    sizes = weight_bytes(released)
    assert 28.0e9 < sizes["lm"] < 28.6e9 and 0.7e9 < sizes["vit"] < 0.9e9


def test_the_memory_check_counts_the_released_model_on_a_gpu(released):
    from walkserve.placement.plan import parse_placement
    from walkserve.placement.resolve import check_placement

    model = BagelModel(ModelRef("bagel", str(released)))
    comps, graph = model.components(), model.graph()

    def check(budget: str, free: int):
        placement = {"ranks": [{"id": 0, "device": "cuda:0", "memory": budget}],
                     "nodes": [{"nodes": graph.node_names(), "ranks": [0]}]}
        check_placement(parse_placement(placement, "bagel.yaml"), graph, {"lm"},
                        {c: s.weight_bytes for c, s in comps.items()}, {c: s.state_bytes for c, s in comps.items()},
                        device_free=lambda device: free)

    check("80GiB", 80 << 30)  # an H100: weights ~29.5 GB, a KV pool of half the rest, one step's activations
    with pytest.raises(PlacementError, match="weights of lm"):
        check("24GiB", 24 << 30)


def test_understanding_stops_at_im_end_unless_ignore_eos(proc):
    messages = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    stops = proc.build_request("chat", messages, SamplingParams(max_tokens=4), proc.check_params({}))
    assert stops.sampling.stop_token_ids == (proc.tokens.im_end,)
    exact = proc.build_request("chat", messages, SamplingParams(max_tokens=4, ignore_eos=True), proc.check_params({}))
    assert exact.sampling.stop_token_ids == () and exact.sampling.max_tokens == 4


def test_the_cfg_parallel_placement_takes_the_walks_that_write_each_context_on_its_rank(model):
    """On bagel-cfg-parallel the model turns cfg_parallel on: cfg_text is written by lm_cfg_text (no fork from
    gen, which lives on another rank) and the check passes; the forking walks there are refused, naming it."""
    import yaml

    from walkserve.cli.placement_arg import placement_path
    from walkserve.graph.kv import declared_ops
    from walkserve.placement.plan import parse_placement
    from walkserve.placement.resolve import check_state_kept_together, walk_nodes

    data = yaml.safe_load(placement_path("bagel-cfg-parallel").read_text())
    parallel = model.for_placement(data)
    assert parallel.ref.options["cfg_parallel"] is True
    assert model.for_placement(yaml.safe_load(placement_path("bagel").read_text())) is model
    placement = parse_placement(data, "bagel-cfg-parallel.yaml")
    graph = parallel.graph()
    check_state_kept_together(placement, graph, walk_nodes(graph), {"lm"})
    ops = {w: {n: [(o.op, o.context) for o in declared_ops(graph.plans[w].nodes[n].params)]
               for n in graph.plans[w].nodes if n.startswith("lm")} for w in ("prefill_text", "prefill_system",
                                                                            "prefill_vae", "prefill_vit_edit")}
    assert ops["prefill_text"] == {"lm": [("append", "gen")], "lm_cfg_img": [("append", "cfg_img")]}
    assert ops["prefill_system"]["lm_cfg_text"] == [("append", "cfg_text")]
    assert ops["prefill_vae"]["lm_cfg_text"] == ops["prefill_vit_edit"]["lm_cfg_text"] == [("append", "cfg_text")]
    forking = BagelModel(ModelRef("bagel", model.ref.path, {"cfg_parallel": False}))
    assert forking.for_placement(data) is forking
    with pytest.raises(PlacementError, match="its context 'cfg_text' must be placed on the same ranks"):
        check_state_kept_together(placement, forking.graph(), walk_nodes(forking.graph()), {"lm"})


def test_the_memory_report_gives_the_released_sizes_per_rank(released):
    import yaml

    from walkserve.cli.placement_arg import placement_path
    from walkserve.placement.plan import parse_placement

    model = BagelModel(ModelRef("bagel", str(released)))
    data = yaml.safe_load(placement_path("bagel-cfg-parallel").read_text())
    lines = model.memory_report(parse_placement(data, "bagel-cfg-parallel.yaml"))
    assert lines[0].startswith(f"checkpoint {released.name}: 14.69B parameters (7.62B active per LLM token), 27.36 GiB")
    assert "KV 56 KiB per token in bf16; a flow step queries up to 3 x 4,098 rows" in lines[0]
    assert lines[1].startswith("rank 0 (cuda:0): latents 0.05 GiB, lm 26.34 GiB, vae_decoder 0.09 GiB")
    assert lines[2] == "rank 1 (cuda:1): latents 0.05 GiB, lm 26.34 GiB; plus lm's KV pool (its own contexts)"
