"""Consistency of the project: migrations, the engine's independence, the README, the
changelog and the pages under docs/."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import call_command, get_commands

from tests.conftest import ROOT, subprocess_env


@pytest.mark.django_db
def test_makemigrations_finds_nothing():
    call_command("makemigrations", "--check", "--dry-run", stdout=StringIO())


def test_cleanup_never_imports_reservations():
    for path in (ROOT / "cleanup").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(n.split(".")[0] == "reservations" for n in names), path


@pytest.mark.django_db
def test_django_starts_with_cleanup_installed_and_reservations_absent():
    process = subprocess.run(
        [sys.executable, "manage.py", "check", "--fail-level", "WARNING"],
        cwd=ROOT, env=subprocess_env(DJANGO_SETTINGS_MODULE="tests.engine_only_settings"),
        capture_output=True, text=True, timeout=120,
    )
    assert process.returncode == 0, process.stderr
    assert "no issues" in process.stdout
    migrations = subprocess.run(
        [sys.executable, "manage.py", "makemigrations", "--check", "--dry-run"],
        cwd=ROOT, env=subprocess_env(DJANGO_SETTINGS_MODULE="tests.engine_only_settings"),
        capture_output=True, text=True, timeout=120,
    )
    assert migrations.returncode == 0, migrations.stdout + migrations.stderr


DOCS = ROOT / "docs"
FENCED = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`]+`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+?)\s*$", re.MULTILINE)


def pages() -> list:
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted(DOCS.glob("*.md"))]


def prose(path) -> str:
    """The page without its code blocks, where a heading or a link means nothing."""
    return FENCED.sub("", path.read_text())


def section(path, heading: str) -> str:
    """The text under a second-level heading, up to the next one."""
    return path.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation but hyphens and
    underscores dropped, spaces made hyphens."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path) -> set[str]:
    """Every heading's anchor on a page; GitHub numbers a repeated one -1, -2..."""
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(prose(path)):
        anchor = github_anchor(heading)
        found.add(f"{anchor}-{seen[anchor]}" if anchor in seen else anchor)
        seen[anchor] = seen.get(anchor, 0) + 1
    return found


def test_every_command_the_docs_name_exists():
    named = set()
    for page in pages():
        named |= set(re.findall(r"manage\.py (\w+)", page.read_text()))
    assert {"cleanup_dispatch", "cleanup_status", "cleanup_replay", "cleanup_schedule",
            "seed_reservations"} <= named
    assert named <= set(get_commands())


def test_every_command_of_the_project_is_described_under_commands():
    ours = {name for name, app in get_commands().items()
            if app in ("cleanup", "reservations", "config.devtools")}
    described = set(re.findall(r"^- `python manage\.py (\w+)",
                               section(DOCS / "operations.md", "Commands"), re.MULTILINE))
    assert sorted(ours - described) == []


def test_every_setting_is_documented_on_the_settings_page():
    from cleanup.conf import DEFAULTS
    from reservations.conf import conf as reservations_conf

    page = (DOCS / "settings.md").read_text()
    names = [f"CLEANUP_{n}" for n in DEFAULTS]
    names += [f"RESERVATIONS_{n}" for n in reservations_conf._defaults]
    missing = [n for n in names if n not in page]
    assert missing == []


def test_the_readme_reads_in_five_minutes():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300


def test_every_relative_link_in_the_docs_reaches_a_file_and_a_heading():
    broken, checked = [], 0
    for page in pages():
        for target in LINK.findall(INLINE_CODE.sub("", prose(page))):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            checked += 1
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert checked >= 20  # the pages link to each other; the pattern still finds them
    assert broken == []


@pytest.mark.django_db
def test_production_lists_no_development_tool_and_the_dev_settings_do():
    def commands(settings_module: str, **env) -> str:
        result = subprocess.run(
            [sys.executable, "manage.py", "help"], cwd=ROOT, capture_output=True, text=True,
            env=subprocess_env(DJANGO_SETTINGS_MODULE=settings_module, **env), timeout=120)
        assert result.returncode == 0, result.stderr
        return result.stdout

    production = commands("config.settings", DJANGO_PROFILE="production",
                          DJANGO_SECRET_KEY="x" * 50, DJANGO_ALLOWED_HOSTS="cleanup.example.edu")
    assert "cleanup_dispatch" in production
    assert "cleanup_bench" not in production and "cleanup_soak" not in production
    development = commands("config.dev_settings")
    assert "cleanup_bench" in development and "cleanup_soak" in development
