"""Each setting in one place: one typed property and one rule per CLEANUP_* setting, the
settings read only through cleanup.conf, one id per error, and every id documented on
the settings page and pinned by a test named for it."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

from cleanup.conf import Settings
from cleanup.rules import RULES
from tests.conftest import ROOT

ENGINE = ROOT / "cleanup"
ID = re.compile(r"cleanup\.[EW]\d{3}")
CHECK_MESSAGES = {"Debug", "Info", "Warning", "Error", "Critical"}


def sources(*folders: str) -> list[Path]:
    return sorted(path for folder in folders for path in (ROOT / folder).rglob("*.py"))


def check_message_ids() -> tuple[list[str], list[str]]:
    """The ids given as literals to checks.Error and its kin in cleanup/, and where one
    is not a literal (so it cannot be read here)."""
    literal, hidden = [], []
    for path in sources("cleanup"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in CHECK_MESSAGES):
                continue
            for keyword in node.keywords:
                if keyword.arg != "id":
                    continue
                if isinstance(keyword.value, ast.Constant):
                    literal.append(keyword.value.value)
                else:
                    hidden.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return literal, hidden


def every_id() -> set[str]:
    return set(check_message_ids()[0]) | {rule.id for rule in RULES}


def test_every_setting_is_one_typed_documented_property():
    untyped = [name for name in Settings.names()
               if "return" not in vars(Settings)[name].fget.__annotations__
               or not vars(Settings)[name].__doc__]
    assert untyped == []


def test_every_setting_has_exactly_one_rule():
    assert Counter(rule.name for rule in RULES) == Counter(Settings.names())


def test_every_rule_has_an_id_of_its_own():
    shared = {id_: n for id_, n in Counter(rule.id for rule in RULES).items() if n > 1}
    assert shared == {}


def test_no_id_is_given_to_two_errors():
    literal, hidden = check_message_ids()
    # Only a Rule passes its id on (cleanup.rules.Rule.errors); RULES lists those.
    assert [place for place in hidden if not place.startswith("cleanup/rules.py:")] == []
    given = Counter(literal) + Counter(rule.id for rule in RULES)
    assert {id_: n for id_, n in given.items() if n > 1} == {}
    assert {"cleanup.E001", "cleanup.E006", "cleanup.W003"} <= set(literal)


def test_every_id_is_named_on_the_settings_page():
    page = (ROOT / "docs/settings.md").read_text()
    assert sorted(every_id() - set(ID.findall(page))) == []


def test_the_docs_and_the_code_name_no_id_that_is_not_given():
    known = every_id()
    named = {(str(path.relative_to(ROOT)), id_)
             for path in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md",
                          *sources("cleanup", "reservations", "config")]
             for id_ in ID.findall(path.read_text()) if id_ not in known}
    assert sorted(named) == []


def test_every_id_has_a_test_named_for_it():
    tests = "\n".join(path.read_text() for path in sorted((ROOT / "tests").rglob("test_*.py")))
    named = {f"cleanup.{code.upper()}" for code in re.findall(r"^def test_([ew]\d{3})_", tests,
                                                                  re.MULTILINE)}
    assert sorted(every_id() - named) == []


def test_settings_are_read_only_through_cleanup_conf():
    """No CLEANUP_* setting and no Q_CLUSTER key is read outside cleanup.conf, in the
    engine or the product: each has its one typed reader there."""
    conf_module = ENGINE / "conf.py"
    reads = []
    for path in sources("cleanup", "reservations"):
        if path == conf_module:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            name = None
            if isinstance(node, ast.Attribute):
                name = node.attr
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in ("getattr", "hasattr") and len(node.args) > 1
                  and isinstance(node.args[1], ast.Constant)):
                name = node.args[1].value
            if isinstance(name, str) and (name == "Q_CLUSTER" or name.startswith("CLEANUP_")):
                reads.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    assert reads == []
