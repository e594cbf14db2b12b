import pytest

from walkserve.core.errors import ConfigError
from walkserve.planner.devices import parse_devices
from walkserve.planner.planning import parse_slo
from walkserve.planner.workload import RequestKind, Workload, load_workload


def test_devices_from_specs_and_a_file(tmp_path):
    assert [d.device for d in parse_devices("cpu:0,cpu:1")] == ["cpu", "cpu"]
    gpus = parse_devices("cuda:0-2@141GiB")
    assert [d.device for d in gpus] == ["cuda:0", "cuda:1", "cuda:2"]
    assert {d.memory for d in gpus} == {141 << 30}
    f = tmp_path / "d.yaml"
    f.write_text("devices:\n  - {device: cuda:0, memory: 80GiB, host: 10.0.0.2}\n  - {device: cuda:1-2, memory: 40GiB}\n")
    devs = parse_devices(str(f))
    assert [(d.device, d.memory >> 30, d.host) for d in devs] == [("cuda:0", 80, "10.0.0.2"), ("cuda:1", 40, None),
                                                                  ("cuda:2", 40, None)]
    for bad in ("tpu:0", "cuda:3-1", "cuda:0@lots"):
        with pytest.raises(ConfigError):
            parse_devices(bad)


def test_workload_mix_keeps_the_proportions(tmp_path):
    w = Workload((RequestKind("a", 0.6, "chat", {}), RequestKind("b", 0.3, "chat", {}), RequestKind("c", 0.1, "chat", {})))
    names = [k.name for k in w.mix(10)]
    assert (names.count("a"), names.count("b"), names.count("c")) == (6, 3, 1)
    f = tmp_path / "w.yaml"
    f.write_text("concurrency: 3\nkinds:\n  - {name: s, weight: 2, task: speech, payload: {input: hi}, max_tokens: 8}\n")
    loaded = load_workload(f)
    assert loaded.concurrency == 3 and loaded.kinds[0].max_tokens == 8 and loaded.name == "w"
    f.write_text("rate: 2.5\nkinds:\n  - {task: speech, payload: {input: hi}}\n")
    open_loop = load_workload(f)
    assert open_loop.rate == 2.5 and open_loop.load.rate == 2.5  # Poisson arrivals instead of a closed loop
    f.write_text("rate: 0\nkinds:\n  - {task: speech}\n")
    with pytest.raises(ConfigError, match="rate must be a positive"):
        load_workload(f)
    f.write_text("kinds:\n  - {task: speech, weight: -1}\n")
    with pytest.raises(ConfigError, match="weight must be a positive"):
        load_workload(f)


def test_slo_parsing():
    slo = parse_slo(["ttfa=0.5s", "throughput=2"])
    assert (slo.ttfa_s, slo.throughput) == (0.5, 2.0)
    with pytest.raises(ConfigError):
        parse_slo(["latency=1"])
