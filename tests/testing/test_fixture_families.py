"""The fixture models are plugin families: entry points register them, no runtime code imports walkserve.testing."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points

from walkserve.models.registry import ENTRY_POINTS
from walkserve.testing.fixtures import BENCH, FIXTURES


def test_the_entry_points_list_every_fixture_family():
    registered = {e.name: e.value for e in entry_points(group=ENTRY_POINTS)}
    assert {name: registered.get(name) for name in {**FIXTURES, **BENCH}} == {**FIXTURES, **BENCH}


def test_the_registry_knows_the_fixtures_without_importing_test_support():
    code = (
        "import sys\n"
        "from walkserve.models.registry import families, load_model\n"
        "from walkserve.models.base import ModelRef\n"
        "assert {'fixture-omni', 'fixture-bench-null', 'llama', 'orpheus'} <= set(families()), families()\n"
        "assert not [m for m in sys.modules if m.startswith('walkserve.testing')], 'runtime code imported walkserve.testing'\n"
        "load_model(ModelRef('fixture-omni')).graph()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_walkserve_graph_renders_a_fixture_family():
    """The README's `walkserve graph fixture-omni` (the CLI finds the family through its entry point)."""
    out = subprocess.run([sys.executable, "-m", "walkserve.cli.main", "graph", "fixture-omni"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "thinker" in out.stdout
