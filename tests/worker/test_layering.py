"""The worker's modules call down only: no import circle (annotations included), nothing below the executor names it.

A pass's calls go executor -> cohort -> iteration -> streams -> effects/state; what must go
up (a finished walk, a failure) is queued on ``effects`` or returned. A back-call
needs an import of the module above (or a reference to the Executor), so both
fail here.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import walkserve.worker

PACKAGE = "walkserve.worker"
ROOT = pathlib.Path(walkserve.worker.__file__).parent


def _modules() -> dict[str, ast.Module]:
    return {p.stem: ast.parse(p.read_text()) for p in sorted(ROOT.glob("*.py")) if p.stem != "__init__"}


def _imports(tree: ast.Module) -> set[str]:
    """Worker modules this one imports anywhere (module level, TYPE_CHECKING blocks, inside functions)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == PACKAGE:
                out |= {a.name for a in node.names}
            elif node.module.startswith(PACKAGE + "."):
                out.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[2] for a in node.names if a.name.startswith(PACKAGE + ".")}
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(tree) & set(mods) - {name} for name, tree in mods.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        path.append(v)
        for w in sorted(graph[v]):
            if state.get(w) == 1:
                return [*path[path.index(w):], w]
            if w not in state and (found := visit(w)):
                return found
        path.pop()
        state[v] = 2
        return None

    for v in sorted(graph):
        if v not in state and (found := visit(v)):
            return found
    return None


def _below(graph: dict[str, set[str]], top: str) -> set[str]:
    seen, todo = set(), [top]
    while todo:
        for w in graph[todo.pop()]:
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def _names(tree: ast.Module) -> set[str]:
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    names |= {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return names | {w for s in strings for w in s.replace('"', " ").replace("'", " ").split() if w.isidentifier()}


def test_the_worker_modules_import_no_circle():
    graph = _graph()
    assert "executor" in graph["worker"] and "cohort" in graph["executor"]  # the graph is the real one
    assert _cycle(graph) is None, f"import circle: {' -> '.join(_cycle(graph))}"


def test_nothing_below_the_executor_names_it():
    graph, mods = _graph(), _modules()
    below = _below(graph, "executor")
    assert {"cohort", "iteration", "streams", "transition", "effects", "engine_set", "state"} <= below
    named = sorted(name for name in below if "Executor" in _names(mods[name]))
    assert named == [], f"modules below the executor that name it: {named}"


def test_the_checks_find_a_back_call():
    """The checks themselves: a module below that imports the executor closes a circle and names it."""
    graph = _graph()
    graph["iteration"] = graph["iteration"] | {"executor"}
    assert _cycle(graph) is not None
    tree = ast.parse("from walkserve.worker.executor import Executor\ndef f(ex: Executor) -> None: ...")
    assert "executor" in _imports(tree) and "Executor" in _names(tree)


OWNED = {"state": ("RequestState", "WalkRun", "Member", "StreamIn"), "effects": ("Effects",)}  # module -> classes
MUTATORS = frozenset({"append", "extend", "pop", "popitem", "setdefault", "clear", "update", "add", "discard", "remove"})


def _fields(module: str) -> set[str]:
    """The slots of the classes ``module`` owns (OWNED)."""
    tree = _modules()[module]
    fields = set()
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in OWNED[module]):
        for node in cls.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
                fields |= {e.value for e in node.value.elts}
    return fields


def _foreign_writes(tree: ast.Module, fields: set[str]) -> list[str]:
    """Writes to a state field through something other than ``self``: ``x.f = ...``, ``x.f[k] = ...``,
    ``x.f += ...``, ``x.f.append(...)`` (and the other mutating calls)."""

    def field_of(node: ast.AST) -> str | None:
        while isinstance(node, ast.Subscript):
            node = node.value
        if isinstance(node, ast.Attribute) and node.attr in fields:
            if not (isinstance(node.value, ast.Name) and node.value.id == "self"):
                return node.attr
        return None

    found = []
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = [e for t in node.targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            targets = [node.func.value]
        found += [f"{ast.unparse(t)} (line {t.lineno})" for t in targets if field_of(t)]
    return found


@pytest.mark.parametrize("owner", sorted(OWNED))
def test_state_fields_are_written_only_by_their_own_class(owner):
    """In every other module that handles the objects (it imports their module)."""
    fields, mods, graph = _fields(owner), _modules(), _graph()
    assert {"state": {"phase", "cur", "members", "pausing", "failed"}, "effects": {"dirty", "done", "counters"}}[owner] <= fields
    users = [name for name in mods if owner in graph[name]]
    assert {"cohort", "iteration", "executor"} <= set(users)
    writes = {name: w for name in users if (w := _foreign_writes(mods[name], fields))}
    assert writes == {}, writes
    caught = _foreign_writes(ast.parse("m.k = 1\nm.cur['a'] = {}\nrun.members.pop(key)\nself.k = 2"), _fields("state"))
    assert caught == ["m.k (line 1)", "m.cur['a'] (line 2)", "run.members (line 3)"]  # the check itself
