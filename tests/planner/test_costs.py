import pytest

from walkserve.core.errors import ConfigError
from walkserve.planner.costs import CostTable, NodeCost, RequestItems, cache_key, cache_path


def test_fit_recovers_a_line_and_scales_by_threads():
    cost = NodeCost()
    for c, b in ((1, 1.0), (2, 2.0), (4, 3.5)):
        cost.add(2, c, b, 0.004 + 0.001 * b)
    fixed, per_item = cost.fit(2)
    assert fixed == pytest.approx(0.004)
    assert per_item == pytest.approx(0.001)
    assert cost.step_seconds(3.0, 2) == pytest.approx(0.007)
    assert cost.step_seconds(3.0, 1) == pytest.approx(0.014)  # one thread, never measured: twice the work time


def test_fit_takes_the_fastest_repeat_of_each_concurrency():
    # a step of 2 ms + 0.1 ms per item; one repeat at each of the two larger batches was slowed by other work on
    # the host (1.5x): least squares over every sample tripled the per-item cost, so batching looked dear
    cost = NodeCost()
    for c in (1, 2, 4, 8):
        cost.add(1, c, float(c), 0.002 + 0.0001 * c)
        cost.add(1, c, float(c), (0.002 + 0.0001 * c) * (1.5 if c >= 4 else 1.0))
    cost.add(1, 8, 4.0, 0.005)  # a repeat that batched less and took longer per item: not the fastest
    fixed, per_item = cost.fit(1)
    assert (fixed, per_item) == (pytest.approx(0.002), pytest.approx(0.0001))
    assert cost.step_seconds(4.0, 1) / cost.step_seconds(2.0, 1) == pytest.approx(2.4 / 2.2)


def test_a_step_at_a_measured_batch_is_what_it_measured():
    # both repeats at 8 slowed (no fastest repeat is clean there): the batches the placements run at (up to 4)
    # keep their measured steps, interpolated between them, and only a batch beyond 8 follows the line's slope
    cost = NodeCost()
    for c, seconds in ((1, 0.0020), (2, 0.0021), (4, 0.0023), (8, 0.0046), (8, 0.0050)):
        cost.add(1, c, float(c), seconds)
    cost.add(1, 2, 2.0, 0.0019)  # the fastest repeat at 2, below the step at 1: a larger batch is never cheaper
    assert cost.step_seconds(1.0, 1) == pytest.approx(0.0020)
    assert cost.step_seconds(2.0, 1) == pytest.approx(0.0020)
    assert cost.step_seconds(3.0, 1) == pytest.approx(0.00215)
    assert cost.step_seconds(4.0, 1) == pytest.approx(0.0023)
    assert cost.step_seconds(4.0, 2) == pytest.approx(0.00115)  # two threads, never measured: half
    assert cost.step_seconds(16.0, 1) == pytest.approx(0.0046 + 8 * cost.fit(1)[1])


def test_batch_at_interpolates_between_concurrencies_and_grows_beyond():
    cost = NodeCost()
    cost.add(1, 1, 1.0, 0.01)
    cost.add(1, 4, 3.0, 0.02)
    assert cost.batch_at(1, 1) == pytest.approx(1.0)
    assert cost.batch_at(2.5, 1) == pytest.approx(2.0)
    assert cost.batch_at(8, 1) == pytest.approx(6.0)


def test_table_round_trips_and_rejects_a_damaged_file(tmp_path):
    cost = NodeCost()
    cost.add(2, 4, 3.0, 0.02)
    table = CostTable("k", {"lm": cost}, {"lm": 64.0}, {2: 0.05}, 3e-4, "mix", 2e-3)
    table.loop.add(2, 4, 3.0, 4e-4)
    table.frontend_s = 3e-3
    table.requests = [RequestItems("spoken", {"lm": 17.0, "codec": 1.0}), RequestItems("text", {"lm": 32.0})]
    path = tmp_path / "p.json"
    table.save(path)
    back = CostTable.load(path)
    assert back.to_json() == table.to_json()
    assert back.hop_latency_s == 2e-3
    assert back.nodes["lm"].step_seconds(3.0, 2) == pytest.approx(0.02)
    assert (back.loop_seconds(3.0, 2), back.frontend_s) == (pytest.approx(4e-4), 3e-3)
    assert back.requests == table.requests
    old = table.to_json()
    del old["loop"], old["frontend_s"], old["requests"]
    assert CostTable.from_json(old).loop_seconds(3.0, 2) == 0.0  # a profile cached before they were measured
    assert CostTable.from_json(old).requests == []
    path.write_text('{"format": 1, "key": "k", "nodes": {"lm": {"2": [[1]]}}, "items_per_request": {}}')
    with pytest.raises(ConfigError, match="damaged profile"):
        CostTable.load(path)
    path.write_text('{"format": 99}')
    with pytest.raises(ConfigError, match="not a walkserve profile"):
        CostTable.load(path)


def test_cache_key_separates_device_kind_dtype_and_checkpoint(tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": 8}')
    a = cache_key("orpheus", str(tmp_path), "cpu", "float32")
    assert a != cache_key("orpheus", str(tmp_path), "cuda", "float32")
    assert a != cache_key("orpheus", str(tmp_path), "cpu", "bfloat16")
    (tmp_path / "config.json").write_text('{"hidden_size": 16}')
    assert a != cache_key("orpheus", str(tmp_path), "cpu", "float32")
    assert cache_path(a, tmp_path).parent == tmp_path
