"""Consistency of the project: migrations, the engine's independence, the README."""

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


def test_every_command_in_the_readme_exists():
    readme = (ROOT / "README.md").read_text()
    named = set(re.findall(r"manage\.py (\w+)", readme))
    assert {"cleanup_dispatch", "cleanup_status", "cleanup_replay", "cleanup_schedule",
            "seed_reservations"} <= named
    assert named <= set(get_commands())


def test_every_setting_is_documented_in_the_readme():
    from cleanup.conf import DEFAULTS
    from reservations.conf import conf as reservations_conf

    readme = (ROOT / "README.md").read_text()
    names = [f"CLEANUP_{n}" for n in DEFAULTS]
    names += [f"RESERVATIONS_{n}" for n in reservations_conf._defaults]
    missing = [n for n in names if n not in readme]
    assert missing == []


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
