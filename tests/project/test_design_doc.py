"""docs/design.md kept true: its folder tree names the engine's modules, its models
are the ones cleanup.models exports, and its table of writers says which module writes
which table."""

from __future__ import annotations

import ast
import fnmatch
import re
from dataclasses import dataclass, field
from pathlib import Path

from django.apps import apps
from django.db import models

import cleanup.models
from tests.conftest import ROOT

DESIGN = ROOT / "docs" / "design.md"
ENGINE = ROOT / "cleanup"

# ---------------------------------------------------------------------------------
# The folder tree


@dataclass
class Entry:
    """One name in the tree: ``ledger.py`` or ``engine/``, with what the tree says of it."""

    path: str  # relative to cleanup/: "engine/window.py", "engine/"
    description: str
    children: list[Entry] = field(default_factory=list)

    @property
    def is_folder(self) -> bool:
        return self.path.endswith("/")


ENTRY = re.compile(r"^(?P<indent> *)(?P<name>[\w.-]+(?:\.py|/))(?: {2,}(?P<text>\S.*))?$")
FOLDERS_ONLY = re.compile(r"^ *(?:[\w-]+/ *)+$")


def section_text(markdown: str, heading: str) -> str:
    """The text under a heading (any level), up to the next heading of any level."""
    after = markdown.split(f"\n{heading}\n", 1)[1]
    return re.split(r"^#{1,6} ", after, maxsplit=1, flags=re.MULTILINE)[0]


def tree_block(markdown: str) -> list[str]:
    """The lines of the fenced block under "The folder tree" that starts with cleanup/."""
    text = section_text(markdown, "### The folder tree")
    block = re.search(r"^```\n(cleanup/\n.*?)^```", text, re.MULTILINE | re.DOTALL)
    assert block, "no fenced block starting with cleanup/ under 'The folder tree'"
    return block.group(1).splitlines()


def parse_tree(lines: list[str]) -> tuple[list[Entry], list[str]]:
    """The top-level entries, and the folders named on a line of folders alone.

    An entry is a ``name.py`` or ``name/`` two spaces deeper than its folder, followed
    by what it holds; a line indented further than that is the description going on.
    """
    root = Entry("", "")
    stack: list[tuple[int, Entry]] = [(0, root)]  # (indent of the folder's line, folder)
    last: Entry = root
    summarised: list[str] = []
    for line in lines[1:]:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        match = None if FOLDERS_ONLY.match(line) else ENTRY.match(line)
        if (match or FOLDERS_ONLY.match(line)) and indent <= stack[-1][0] + 2:
            while len(stack) > 1 and indent <= stack[-1][0]:
                stack.pop()
        folder = stack[-1][1]
        if match and indent == stack[-1][0] + 2:
            last = Entry(folder.path + match["name"], match["text"] or "")
            folder.children.append(last)
            if last.is_folder:
                stack.append((indent, last))
        elif FOLDERS_ONLY.match(line) and indent == stack[-1][0] + 2:
            summarised += [folder.path + name for name in line.split()]
        else:
            last.description = f"{last.description} {line.strip()}".strip()
    return root.children, summarised


def walk(entries: list[Entry]):
    for entry in entries:
        yield entry
        yield from walk(entry.children)


def documented_tree() -> tuple[list[Entry], list[str]]:
    return parse_tree(tree_block(DESIGN.read_text()))


def pattern_of(entry: Entry) -> str | None:
    """The glob a folder's description opens with (``cleanup_*.py``), if any."""
    first = entry.description.split(" ", 1)[0].rstrip(":,;")
    return first if "*" in first else None


def test_the_folder_tree_names_every_module_and_nothing_else():
    """Every module under cleanup/ is named in the design doc's tree, at its place, and
    every name there exists.

    - A package is named by its folder (``engine/``), so ``__init__.py`` files are not
      listed; a folder with modules listed under it must be a package.
    - Every folder is named too, but for ``__pycache__``. The folders the tree names on
      a line of folders alone (``migrations/``, ``templates/``, ``static/``) must exist;
      what is in them is not listed (numbered migrations, no Python modules).
    - A folder whose description opens with a glob (``commands/  cleanup_*.py ...``)
      stands for every module in it, and each of them must match the glob.
    """
    entries, summarised = documented_tree()
    named, patterns = set(), {}
    for entry in walk(entries):
        named.add(entry.path)
        if entry.is_folder and (pattern := pattern_of(entry)):
            patterns[entry.path] = pattern
    missing = sorted(path for path in named if not (ENGINE / path).exists())
    missing += [path for path in summarised if not (ENGINE / path).is_dir()]
    not_packages = sorted(entry.path for entry in walk(entries)
                          if entry.is_folder and (entry.children or entry.path in patterns)
                          and not (ENGINE / entry.path / "__init__.py").exists())
    unnamed, off_pattern = [], []
    for folder in sorted(path for path in ENGINE.rglob("*") if path.is_dir()):
        path = folder.relative_to(ENGINE).as_posix() + "/"
        if folder.name != "__pycache__" and path not in named \
                and not any(path.startswith(s) for s in summarised):
            unnamed.append(path)
    for module in sorted(ENGINE.rglob("*.py")):
        path = module.relative_to(ENGINE).as_posix()
        folder = path.rsplit("/", 1)[0] + "/" if "/" in path else ""
        if module.name == "__init__.py" or any(path.startswith(s) for s in summarised):
            continue
        if folder in patterns:
            if not fnmatch.fnmatch(module.name, patterns[folder]):
                off_pattern.append(path)
        elif path not in named:
            unnamed.append(path)
    assert missing == [], "named in docs/design.md's tree, not in cleanup/"
    assert not_packages == [], "folders the tree lists modules of, without an __init__.py"
    assert unnamed == [], "in cleanup/, not named in docs/design.md's tree"
    assert off_pattern == [], "modules of a folder the tree names by a glob, not matching it"


def test_the_tree_reader_sees_each_entry_in_its_folder():
    entries, summarised = parse_tree([
        "cleanup/",
        "  apps.py            start-up",
        "  engine/            the engine",
        "    window.py        at most W chunks; the next",
        "                     planned as one ends",
        "    commands/        cleanup_*.py: one per verb",
        "  tasks.py           entry points",
        "  migrations/  static/",
    ])
    assert [entry.path for entry in walk(entries)] == [
        "apps.py", "engine/", "engine/window.py", "engine/commands/", "tasks.py"]
    assert entries[1].children[0].description == "at most W chunks; the next planned as one ends"
    assert pattern_of(entries[1].children[1]) == "cleanup_*.py"
    assert summarised == ["migrations/", "static/"]


# ---------------------------------------------------------------------------------
# The models


def exported_models() -> dict[str, str]:
    """Each model cleanup.models exports, with the module that defines it."""
    return {name: obj.__module__ for name in cleanup.models.__all__
            if isinstance(obj := getattr(cleanup.models, name), type)
            and issubclass(obj, models.Model)}


def documented_models() -> dict[str, str]:
    """The models the tree lists for each file of models/: the names its description
    opens with, up to the first colon or semicolon."""
    entries, _ = documented_tree()
    found = {}
    for entry in walk(entries):
        if entry.path.startswith("models/") and entry.path.endswith(".py"):
            listed = re.split(r"[:;]", entry.description, maxsplit=1)[0]
            module = "cleanup." + entry.path.removesuffix(".py").replace("/", ".")
            found |= {name.strip(): module for name in listed.split(",") if name.strip()}
    return found


def test_the_tree_lists_every_model_under_the_file_that_defines_it():
    assert documented_models() == exported_models()


# ---------------------------------------------------------------------------------
# The writers

# The ORM calls that write a model's rows. A plain .update()/.create() is only counted
# on a receiver known to be a queryset or an instance: dicts and sets have them too.
WRITES = {"update", "create", "bulk_create", "bulk_update", "get_or_create",
          "update_or_create", "delete", "save"}
SQL_WRITE = re.compile(r'\b(?:INSERT INTO|UPDATE|DELETE FROM)\s+"?(\{[^}]+\}|\w+)')
# A save() or delete() whose model the scan cannot tell from the source, by module and
# receiver, with the model it writes (None: none of the tables the doc's table covers).
KNOWN_RECEIVERS = {
    # A policy's one statement, over its own model: the ledger's purges are policies
    # too (retention.py), so this deletes runs, chunks, slots and events as any
    # policy deletes its rows.
    ("cleanup.engine.worker", "statement"): None,
}


def written_models() -> dict[str, type[models.Model]]:
    """The tables the table of writers covers: the engine's, and django-q2's."""
    found = {}
    for label in ("cleanup", "django_q"):
        for model in apps.get_app_config(label).get_models():
            if not model._meta.proxy:
                found[model.__name__] = model
    return found


def engine_modules() -> dict[str, Path]:
    """Every module of cleanup/ but the migrations (they build the tables)."""
    found = {}
    for path in sorted(ENGINE.rglob("*.py")):
        if "migrations" in path.relative_to(ENGINE).parts:
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MANAGER = re.compile(r"^(?:[\w.]*\.)?(\w+)\.(?:objects|_default_manager|_base_manager)\b")


def bindings(tree: ast.Module, known: dict[str, type[models.Model]]) -> dict[str, str]:
    """Names bound to a model's queryset, instance or list of them, or to its table's
    name (``beats = WorkerHeartbeat.objects.filter(...)``, ``_TABLE = Lease._meta.db_table``)."""
    bound = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign | ast.AnnAssign | ast.NamedExpr) and node.value):
            continue
        value = ast.unparse(node.value)
        named = re.findall(r"\b(\w+)(?:\.objects\b|\._meta\.db_table\b|\()", value)
        model = next((name for name in named if name in known), None)
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        bound |= {target.id: model for target in targets
                  if model and isinstance(target, ast.Name)}
    return bound


def writes_of(name: str, tree: ast.Module, known: dict[str, type[models.Model]]
              ) -> tuple[list[tuple[str, str]], list[str]]:
    """(model, where) for each write of a known model in one module's syntax tree, and
    the writes it cannot attribute."""
    bound = bindings(tree, known)
    own_names = {model.lower(): model for model in known}
    tables = {model._meta.db_table: model_name for model_name, model in known.items()}
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    found, unknown = [], []
    for node in ast.walk(tree):
        where = f"{name}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in WRITES:
            receiver = ast.unparse(node.func.value)
            root = match[1] if (match := re.match(r"(?:self\.)?(\w+)", receiver)) else ""
            call = f"{where} {receiver}.{node.func.attr}()"
            if (direct := MANAGER.match(receiver)) and direct[1] in known:
                found.append((direct[1], call))
            elif model := bound.get(root) or own_names.get(root):
                found.append((model, call))
            elif (name, receiver) in KNOWN_RECEIVERS:
                if model := KNOWN_RECEIVERS[name, receiver]:
                    found.append((model, call))
            elif node.func.attr in ("save", "delete"):
                unknown.append(call)
        elif isinstance(node, ast.JoinedStr) or (
                isinstance(node, ast.Constant) and isinstance(node.value, str)
                and not isinstance(parents.get(node), ast.JoinedStr)):
            if isinstance(parents.get(node), ast.Expr):
                continue  # a docstring, or a string standing alone: prose, not a statement
            text = node.value if isinstance(node, ast.Constant) else ast.unparse(node)
            for table in SQL_WRITE.findall(text):
                expression = table.strip("{}")
                own = re.fullmatch(r"(\w+)\._meta\.db_table", expression)
                if model := (tables.get(table) or bound.get(expression)
                             or (own[1] if own and own[1] in known else None)):
                    found.append((model, f"{where} SQL writing {table}"))
                elif table.startswith("{"):
                    unknown.append(f"{where} SQL writing {table}")
    return found, unknown


def code_writers() -> tuple[dict[str, set[str]], list[str]]:
    known = written_models()
    writers: dict[str, set[str]] = {}
    unknown: list[str] = []
    for name, path in engine_modules().items():
        found, cannot = writes_of(name, ast.parse(path.read_text()), known)
        for model, _ in found:
            writers.setdefault(model, set()).add(name)
        unknown += cannot
    return writers, unknown


def documented_writers() -> dict[str, set[str]]:
    """The table of writers under "Where each write lives": each table's model, with
    the modules (paths under cleanup/) that write it."""
    text = section_text(DESIGN.read_text(), "### Where each write lives")
    rows = re.search(r"^\| table \| written by \|.*\n\|[-|]+\|\n((?:\|.*\n)+)", text,
                     re.MULTILINE)
    assert rows, "no table of writers (| table | written by | ...) under 'Where each write lives'"
    writers: dict[str, set[str]] = {}
    for row in rows.group(1).splitlines():
        tables, modules = row.strip("|").split("|")[:2]
        names = {"cleanup." + path.removesuffix(".py").replace("/", ".")
                 for path in re.findall(r"`([\w/]+\.py)`", modules)}
        for model in re.findall(r"`(\w+)`", tables):
            writers.setdefault(model, set()).update(names)
    return writers


def test_the_table_of_writers_names_every_module_that_writes_each_table():
    """Each model of cleanup and django-q2 written in cleanup/ (the migrations aside) is
    written by exactly the modules the design doc's table names for it.

    A write is a call of a write method (``update``, ``create``, ``delete``, ``save``...)
    on ``Model.objects...``, on a name bound to a queryset, instance or list of the
    model, or on a name that is the model's own (``run.save()``); or an ``INSERT INTO``,
    ``UPDATE`` or ``DELETE FROM`` of the model's table in a string (its name, or
    ``{Model._meta.db_table}`` or a name bound to it). A ``save()`` or ``delete()`` the
    scan cannot attribute fails the test until it is added to ``KNOWN_RECEIVERS``.
    """
    writers, unknown = code_writers()
    assert unknown == [], "writes whose table the scan cannot tell: add to KNOWN_RECEIVERS"
    assert documented_writers() == writers, "docs/design.md's table of writers (left), the code"


def test_the_writer_scan_finds_each_kind_of_write():
    source = '''
from cleanup.models import Halt, Lease, Slot

TABLE = Lease._meta.db_table
SQL = "INSERT INTO cleanup_event (name) VALUES (%s) ON CONFLICT DO UPDATE SET name = 1"

def f(seen, slot_at):
    """UPDATE cleanup_eventtotal in a docstring is prose."""
    Halt.objects.filter(pk=1).update(ended_at=None)
    held = list(Halt.objects.select_for_update())
    held.delete()
    slot = Slot(slot_at=slot_at)
    slot.save()
    cursor.execute(f'DELETE FROM "{TABLE}" WHERE name = %s', ["x"])
    cursor.execute(f'UPDATE "{Slot._meta.db_table}" SET outcome = 1')
    seen.update({"a": 1})
    thing.delete()
'''
    found, unknown = writes_of("m", ast.parse(source), written_models())
    assert sorted({model for model, _ in found}) == ["Event", "Halt", "Lease", "Slot"]
    assert len(found) == 6
    assert unknown == ["m:17 thing.delete()"]
