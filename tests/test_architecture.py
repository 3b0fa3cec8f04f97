"""The engine's shape: no import circle, the chunk lifecycle written in one module,
modules of a readable size, and a folder tree that shows the parts."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENGINE = ROOT / "cleanup"
WRITES = {"update", "create", "bulk_create", "bulk_update", "get_or_create",
          "update_or_create", "delete"}
# The one module that writes runs and chunks (and the migrations, which build them).
LEDGER_WRITER = "cleanup.engine.transitions"


def modules() -> dict[str, Path]:
    found = {}
    for path in ENGINE.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def runtime_imports(path: Path, known: set[str]) -> set[str]:
    """The cleanup modules a module imports when it runs (not under TYPE_CHECKING), at
    any level: a function's own import still closes a circle."""
    tree = ast.parse(path.read_text())
    typing_only = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and ast.unparse(block.test) == "TYPE_CHECKING"
                   for node in ast.walk(block)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cleanup"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in known else node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("cleanup")}
    return {name for name in found if name in known}


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: runtime_imports(path, set(known)) - {name} for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, done = [], set()

    def visit(name, path):
        for target in sorted(graph[name]):
            if target in path:
                found.append([*path[path.index(target):], target])
            elif target not in done:
                visit(target, [*path, target])
        done.add(name)

    for name in sorted(graph):
        if name not in done:
            visit(name, [name])
    return found


def test_no_module_of_the_engine_imports_itself_round_a_circle():
    assert cycles(import_graph()) == []


def test_the_circle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_the_state_machine_imports_only_the_models():
    # cleanup.expressions holds ORM expressions only (a chunk's history is appended
    # to with one); it imports nothing of the engine.
    assert import_graph()[LEDGER_WRITER] <= {"cleanup.models", "cleanup.exceptions",
                                             "cleanup.expressions"}
    assert not {name for name in import_graph()["cleanup.expressions"]
                if name.startswith("cleanup.")}


def test_only_the_state_machine_writes_runs_and_chunks():
    """No Run or Chunk row is created, changed or deleted through the ORM elsewhere
    (a policy's own statement over cleanup's tables, the ledger purge, is the
    worker's generic DELETE, not one of these)."""
    writes = []
    for name, path in modules().items():
        if name == LEDGER_WRITER:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            receiver = ast.unparse(node.func.value)
            if node.func.attr in WRITES and receiver.startswith(("Chunk.objects", "Run.objects")):
                writes.append(f"{name}:{node.lineno} {receiver}.{node.func.attr}")
            if node.func.attr == "save" and receiver in ("run", "chunk", "self.run"):
                writes.append(f"{name}:{node.lineno} {receiver}.save")
    assert writes == []


def test_the_folder_tree_shows_the_parts():
    top = [path.name for path in ENGINE.glob("*.py")]
    assert len(top) <= 20, sorted(top)
    for package in ("engine", "console", "observability", "scheduling"):
        assert (ENGINE / package / "__init__.py").exists()


def test_no_module_is_longer_than_four_hundred_lines():
    long = {name: n for name, path in modules().items()
            if (n := len(path.read_text().splitlines())) > 400}
    assert long == {}


def test_the_engine_imports_nothing_of_the_parts_built_on_it():
    upward = {name: sorted(target for target in targets
                           if target.startswith(("cleanup.console", "cleanup.observability",
                                                 "cleanup.scheduling")))
              for name, targets in import_graph().items() if name.startswith("cleanup.engine")}
    assert {name: targets for name, targets in upward.items() if targets} == {}
