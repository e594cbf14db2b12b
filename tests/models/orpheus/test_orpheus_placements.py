"""The shipped Orpheus placements: package data, found by name or path, valid for the orpheus graph."""

from __future__ import annotations

import pytest

import walkserve.placements
from walkserve.core.errors import PlacementError
from walkserve.models.orpheus.graph import build_graph
from walkserve.placement.plan import load_placement
from walkserve.placement.resolve import check_placement, walk_nodes

EXPECTED = {
    "orpheus-colocated": {"lm": (0,), "codec": (0,)},
    "orpheus-split": {"lm": (0,), "codec": (1,)},
}


def test_shipped_names():
    assert set(EXPECTED) <= set(walkserve.placements.names())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_loads_by_name_and_places_every_orpheus_node(name):
    path = walkserve.placements.path(name)
    assert path.name == f"{name}.yaml" and path.parent.name == "placements"
    assert walkserve.placements.path(f"{name}.yaml") == path
    assert walkserve.placements.path(path) == path  # an existing path is returned as it is
    place = load_placement(path)
    assert all(spec.device == "cpu" for spec in place.ranks.values())
    graph = build_graph()
    walks = walk_nodes(graph)
    assert set(walks) == {"prefill", "decode"}
    for walk, nodes in walks.items():
        for node in nodes:
            assert place.ranks_for(walk, node) == EXPECTED[name][node]
    check_placement(place, graph, {"lm"}, {"lm": 1, "codec": 1}, {"lm": 0, "codec": 0})


def test_unknown_name_lists_the_shipped_ones(tmp_path):
    with pytest.raises(PlacementError, match=r"no placement file 'orpheus-nowhere' \(shipped placements: .*orpheus-split"):
        walkserve.placements.path("orpheus-nowhere")
    with pytest.raises(PlacementError, match="no placement file"):
        walkserve.placements.path(str(tmp_path / "absent.yaml"))


def test_listed_as_package_data():
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).resolve().parents[3] / "pyproject.toml").read_text())
    assert "placements/*.yaml" in pyproject["tool"]["setuptools"]["package-data"]["walkserve"]
