import pytest


@pytest.fixture(scope="module")
def orpheus_dir(tmp_path_factory):
    from walkserve.models.orpheus.tiny import write_tiny_orpheus

    return write_tiny_orpheus(tmp_path_factory.mktemp("planner_orpheus"), lm="tiny", snac="tiny", seed=3)


@pytest.fixture(scope="module")
def orpheus(orpheus_dir):
    from walkserve.cli.serve_target import resolve_target
    from walkserve.models.registry import load_model

    return load_model(resolve_target("orpheus", str(orpheus_dir), None).ref())


@pytest.fixture(autouse=True)
def two_cores(monkeypatch):
    """The cost model divides a host's cores over its CPU ranks: plan for a 2-core host whatever this one has."""
    monkeypatch.setattr("walkserve.planner.score.usable_cores", lambda: 2)


def table(lm_step: float, codec_step: float, hop_s: float = 1e-4, lm_items: float = 64.0, codec_items: float = 7.0,
          lm_fixed: bool = False):
    """A cost table for Orpheus: a step of each node costs ``*_step`` seconds per item with 2 threads, 1.2x that
    with one (a small model's steps use a second core poorly). ``lm_fixed``: an LM step costs ``lm_step`` whatever
    its batch (decode steps of a small batch are bound by reading the weights)."""
    from walkserve.planner.costs import CostTable, NodeCost

    nodes = {}
    for name, step in (("lm", lm_step), ("codec", codec_step)):
        cost = NodeCost()
        for threads in (1, 2):
            for c in (1, 2, 4):
                per_step = step if name == "lm" and lm_fixed else step * c
                cost.add(threads, c, float(c), per_step * (1.2 if threads == 1 else 1.0))
        nodes[name] = cost
    return CostTable("test", nodes, {"lm": lm_items, "codec": codec_items}, {2: 0.05, 1: 0.1}, hop_s)
