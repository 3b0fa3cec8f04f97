"""CHANGELOG.md keeps up with what a host or an operator sees.

Its newest version is pyproject.toml's. The engine's public surface (the names in
``cleanup.__all__`` and ``cleanup.host.__all__``, the CLEANUP_* settings, the system
check ids, the commands and the keys each prints under --json, the engine's schedules,
its models and migrations, the metrics /metrics exports and the shipped alerts) is
recorded for that version in tests/project/public_surface.json. A name added or removed
since must be named, in backticks, in the changelog's newest section, under a version
raised above the recorded one; then record the surface of that version:

    make public-surface   # WRITE_PUBLIC_SURFACE=1 pytest tests/project/test_changelog.py

which runs these same checks first, so the record never takes a change the changelog
does not name.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections import defaultdict
from io import StringIO
from pathlib import Path

import pytest
from django.apps import apps
from django.core.management import call_command, get_commands
from django.utils import timezone
from packaging.version import Version

import cleanup
import cleanup.host
from cleanup.conf import Settings
from cleanup.models import Halt
from cleanup.policies import all_policies
from cleanup.scheduling.schedules import ENGINE_SCHEDULES, NAME_PREFIX
from tests.conftest import ROOT
from tests.engine_app.factories import LeaseFactory
from tests.observability.test_metrics_consistency import RULES, emitted
from tests.project.test_checks_documented import ids_in

CHANGELOG = ROOT / "CHANGELOG.md"
SNAPSHOT = ROOT / "tests/project/public_surface.json"
WRITE = "WRITE_PUBLIC_SURFACE"
VERSION_HEADING = re.compile(r"^## \[(?P<version>[^\]]+)\]", re.MULTILINE)
# A JSON key that names something; a key that is data (a run's id) is not one.
KEY = re.compile(r"[a-z][a-z0-9_]*\Z")
POLICY = "expire-leases"


def pyproject_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def changelog_versions() -> list[str]:
    return VERSION_HEADING.findall(CHANGELOG.read_text())


def newest_section() -> tuple[str, str]:
    """The newest version of the changelog and its section's text."""
    text = CHANGELOG.read_text()
    heading = VERSION_HEADING.search(text)
    following = VERSION_HEADING.search(text, heading.end())
    return heading["version"], text[heading.start():following.start() if following else None]


def keys_of(value, parent: str = "") -> set[str]:
    """Every key of a JSON value, dotted below its parent's (a list's items below the
    list's own key); a key that is data is left out, with what is under it."""
    if isinstance(value, list):
        return set().union(*(keys_of(item, parent) for item in value))
    if not isinstance(value, dict):
        return set()
    found = set()
    for key, item in value.items():
        if KEY.match(key):
            found |= {parent + key} | keys_of(item, f"{parent}{key}.")
    return found


def printed_keys(account) -> dict[str, set[str]]:
    """The keys each engine command prints under --json, from one walk through their
    paths: no run yet, a dispatch (dry, queued, --sync), the run's reports and every
    operator action on it, and the halt of a policy a deploy removed."""
    printed = defaultdict(set)

    def run(command: str, *args: str) -> dict:
        out = StringIO()
        call_command(command, *args, "--json", stdout=out)
        result = json.loads(out.getvalue())
        printed[f"{command} --json"] |= keys_of(result)
        return result

    run("cleanup_status")
    LeaseFactory.create_batch(2, account=account, expired=True)
    run("cleanup_dispatch", "--policy", POLICY, "--dry-run")
    run_id = run("cleanup_dispatch", "--policy", POLICY)["run_id"]
    Halt.objects.create(policy="gone-policy", reason=Halt.PAUSED, actor="alice",
                        began_at=timezone.now())
    for command, *args in [
        ("cleanup_status", run_id),
        ("cleanup_runs",),
        ("cleanup_chunks", run_id),
        ("cleanup_policies",),
        ("cleanup_requeue", run_id, "--dry-run"),
        ("cleanup_requeue", run_id),
        ("cleanup_discard", run_id, "--chunk", "1", "--reason", "obsolete", "--noinput"),
        ("cleanup_replay", run_id),
        ("cleanup_cancel", run_id, "--noinput"),
        ("cleanup_pause", "--policy", POLICY, "--reason", "migration"),
        ("cleanup_resume", "--policy", POLICY),
        ("cleanup_reconcile",),
        ("cleanup_schedule",),
        ("cleanup_ready",),
        ("cleanup_publish",),
    ]:
        run(command, *args)
    LeaseFactory(account=account, expired=True)
    run("cleanup_dispatch", "--policy", POLICY, "--sync")
    return printed


def public_surface(client, account) -> dict[str, list[str]]:
    """The engine's public surface now: its names by kind, each kind sorted."""
    engine = apps.get_app_config("cleanup")
    commands = {name for name, app in get_commands().items() if app == "cleanup"}
    printed = printed_keys(account)
    walked = {kind.split()[0] for kind in printed}
    assert walked == commands, f"printed_keys() does not run {sorted(commands - walked)}"
    surface = {
        "cleanup": cleanup.__all__,
        "cleanup.host": cleanup.host.__all__,
        "settings": [f"CLEANUP_{name}" for name in Settings.names()],
        "checks": [found for found in ids_in(path for path in Path(engine.path).rglob("*.py")
                                             if "migrations" not in path.parts)
                   if found.startswith("cleanup.")],
        "commands": commands,
        **printed,
        # The engine's own tasks and its purges (of its tables and django-q2's).
        "schedules": [NAME_PREFIX + name for name in ENGINE_SCHEDULES]
        + [NAME_PREFIX + policy.name for policy in all_policies()
           if policy.model_label.split(".")[0] in ("cleanup", "django_q")],
        "models": [model.__name__ for model in engine.get_models()],
        "migrations": [path.stem for path in Path(engine.path, "migrations").glob("0*.py")],
        # What the scrape emits (docs/operations.md's table of series lists the same).
        "metrics": emitted(client),
        "alerts": re.findall(r"^\s*- alert: (\w+)$", RULES.read_text(), re.MULTILINE),
    }
    return {kind: sorted(set(names)) for kind, names in sorted(surface.items())}


def differences(recorded: dict, now: dict) -> list[tuple[str, str, str]]:
    """Each name added (+) or removed (-) since the record: (sign, kind, name)."""
    found = []
    for kind in sorted(recorded.keys() | now.keys()):
        before, after = set(recorded.get(kind, [])), set(now.get(kind, []))
        found += [("+", kind, name) for name in sorted(after - before)]
        found += [("-", kind, name) for name in sorted(before - after)]
    return found


def named(name: str, text: str) -> bool:
    """Whether ``text`` names ``name`` in backticks: whole, or its last dotted part
    (`E040` or `cleanup.E040`, `run_rows_changed` or `sync.run_rows_changed`)."""
    last = name.rsplit(".", 1)[-1]
    return re.search(rf"`(?:[^`\s]*\.)?{re.escape(last)}`", text) is not None


def test_the_changelogs_newest_version_is_pyprojects_and_comes_first():
    versions = [Version(version) for version in changelog_versions()]
    assert versions == sorted(set(versions), reverse=True), "newest first, each once"
    assert str(versions[0]) == pyproject_version(), (
        f"CHANGELOG.md's newest version is {versions[0]}, pyproject.toml's "
        f"{pyproject_version()}")


@pytest.mark.django_db
def test_every_change_to_the_public_surface_is_named_in_the_newest_section(client, account):
    recorded = json.loads(SNAPSHOT.read_text())
    surface = public_surface(client, account)
    changes = differences(recorded["surface"], surface)
    version = pyproject_version()
    newest, section = newest_section()
    assert newest == version, f"CHANGELOG.md's newest section is [{newest}], not [{version}]"
    listed = "\n".join(f"  {sign} {kind}: {name}" for sign, kind, name in changes)

    unnamed = [f"  {sign} {kind}: {name}" for sign, kind, name in changes
               if not named(name, section)]
    assert not unnamed, (
        f"CHANGELOG.md's newest section, [{version}], does not name these changes to the "
        f"public surface since {recorded['version']} ({SNAPSHOT.name}):\n"
        + "\n".join(unnamed) + "\nName each in backticks under Added, Changed or Removed "
        "of a new version, with what a host or an operator must do under Upgrade notes.")
    assert not changes or Version(version) > Version(recorded["version"]), (
        f"The public surface changed since {recorded['version']}:\n{listed}\nA change a "
        "host or an operator sees raises the version: raise pyproject.toml's, give it "
        "the newest section of CHANGELOG.md, then run make public-surface.")
    if os.environ.get(WRITE):
        SNAPSHOT.write_text(json.dumps({"version": version, "surface": surface},
                                       indent=1) + "\n")
        return
    assert (recorded["version"], changes) == (version, []), (
        f"{SNAPSHOT.name} records the surface of {recorded['version']}, not of "
        f"{version}:\n{listed}\nRecord it: make public-surface")
