"""docs/structure.md and docs/runtime.md say what the code does: each check reads a claim and the code."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STRUCTURE = (ROOT / "docs" / "structure.md").read_text()
RUNTIME = (ROOT / "docs" / "runtime.md").read_text()


def row(folder: str) -> str:
    """The table row of ``folder`` in docs/structure.md."""
    [line] = [line for line in STRUCTURE.splitlines() if line.startswith(f"| `{folder}")]
    return line


def imported_packages(package: Path) -> set[str]:
    names = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
    return names


def test_core_names_every_package_it_imports():
    third_party = imported_packages(ROOT / "walkserve" / "core") - set(sys.stdlib_module_names) - {"walkserve"}
    assert "standard library and msgspec only" in row("walkserve/core/")
    assert {p for p in third_party if p not in row("walkserve/core/")} == set()


def test_the_worker_row_names_every_worker_module():
    modules = {p.name for p in (ROOT / "walkserve" / "worker").glob("*.py")} - {"__init__.py"}
    assert {m for m in modules if f"`{m}`" not in row("walkserve/worker/")} == set()


def test_every_package_has_its_test_folder_or_says_where_it_is_tested():
    packages = {p.name for p in (ROOT / "walkserve").iterdir() if (p / "__init__.py").is_file()}
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir()}
    elsewhere = {"client": "tests/api/test_client.py", "placements": "tests/models/orpheus/test_orpheus_placements.py"}
    assert packages - folders == set(elsewhere)
    for package, where in elsewhere.items():
        assert f"`{where}`" in row("tests/") and (ROOT / where).is_file(), package


def test_a_tcp_rank_binds_where_the_doc_says(tmp_path):
    """The doc's address for a local ``transport: tcp`` rank is the one its site gets. (A Ray rank binds its
    node's IP: ``tests/ray/test_ray_cluster.py`` reads every worker's address on a three-node cluster.)"""
    from walkserve.protocol.run import RunSpec
    from walkserve.worker.main import local_site

    claim = re.search(r"`transport: tcp` binds a port on ([0-9.]+)", RUNTIME)
    assert claim, "docs/runtime.md no longer says where a tcp rank binds"
    place = {"ranks": [{"id": 0, "device": "cpu"}, {"id": 1, "device": "cpu", "transport": "tcp"}],
             "nodes": [{"nodes": ["lm"], "ranks": [0]}]}
    spec = RunSpec("run", "token", str(tmp_path), "fixture-lm", None, {}, place, "<test>")
    tcp, ipc = local_site(spec, 1), local_site(spec, 0)
    assert tcp.inbox == f"tcp://{claim.group(1)}:0"
    assert ipc.inbox.startswith(f"ipc://{tmp_path}/")


def test_the_heartbeat_is_the_one_worker_run_beats():
    tree = ast.parse((ROOT / "walkserve" / "worker" / "worker.py").read_text())
    run = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "run")
    loop = next(n for n in ast.walk(run) if isinstance(n, ast.While))
    calls = [c.value.func.attr for c in loop.body if isinstance(c, ast.Expr) and isinstance(c.value, ast.Call)]
    beats = [c for c in calls if c != "poll"]
    doc = re.search(r"`Worker.run` is `([^`]+)`", RUNTIME).group(1)
    assert [b.strip().replace(" ", "_") for b in doc.split("→")] == beats


def test_no_source_or_doc_describes_a_compute_thread():
    """The worker runs one thread of work (the heartbeat, docs/runtime.md); only the records of earlier runs
    (performance.md, qwen3-omni-speech.md's measurements) may still name the compute thread they had."""
    records = {"performance.md", "qwen3-omni-speech.md"}
    paths = [*(ROOT / "walkserve").rglob("*.py"), *(p for p in (ROOT / "docs").rglob("*.md") if p.name not in records)]
    stale = [f"{p.relative_to(ROOT)}:{i}" for p in paths
             for i, line in enumerate(p.read_text().splitlines(), 1) if "compute thread" in line.lower()]
    assert not stale, stale
