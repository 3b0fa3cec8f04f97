"""The README's "Install the engine in your project", followed as a newcomer would: a
fresh `django-admin startproject` with this checkout's virtualenv (where the engine is
installed), the section's code blocks written where their `<!-- newcomer: ... -->`
marks say, its commands run in order, against a PostgreSQL database of the test's own.

Three lines are not run as written: the `pip install` (the engine is installed in the
virtualenv already), `createdb` (the test creates a uniquely named database and drops
it after) and the second terminal's `qcluster`, which stays in the foreground; the
section's `--sync` dispatch needs no cluster."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import psycopg

from tests.conftest import ROOT
from tests.project.test_packaging import host_database  # noqa: F401
from tests.project.test_project import section

SECTION = "Install the engine in your project"
MARKED_BLOCK = re.compile(r"^<!-- newcomer: (?P<target>[^>]+?) -->\n```\w*\n(?P<code>.*?)^```",
                          re.MULTILINE | re.DOTALL)
NOT_RUN = ("python -m pip install ", "createdb ")
# The rows a newcomer's product would have made before the first run.
SEED_TOKENS = """
from datetime import timedelta
from django.utils import timezone
from tokens.models import Token
now = timezone.now()
Token.objects.bulk_create([Token(expires_at=now - timedelta(minutes=m)) for m in range(1, 6)]
                          + [Token(expires_at=now + timedelta(hours=h)) for h in range(1, 4)])
"""


def newcomer_steps() -> list[tuple[str, str]]:
    """The section's marked code blocks, in order: (where it goes, its text)."""
    text = section(ROOT / "README.md", SECTION)
    return [(match["target"], match["code"]) for match in MARKED_BLOCK.finditer(text)]


def shell(line: str, project: Path, env: dict) -> str:
    result = subprocess.run(["bash", "-c", line], cwd=project, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, (line, result.stdout[-2000:], result.stderr[-3000:])
    return result.stdout


def test_the_readme_names_the_django_versions_pyproject_allows():
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (django,) = [spec for spec in dependencies if re.match(r"django\s*[<>=~!]", spec, re.I)]
    assert f"`{django}`" in section(ROOT / "README.md", SECTION)


def test_a_newcomer_following_the_readme_gets_a_first_cleanup(tmp_path, host_database):  # noqa: F811
    project = tmp_path / "newcomer"
    project.mkdir()
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path),
           "LANG": "C.UTF-8", "PGHOST": host_database["HOST_DB_HOST"],
           "PGPORT": host_database["HOST_DB_PORT"], "PGUSER": host_database["HOST_DB_USER"],
           "PGDATABASE": host_database["HOST_DB_NAME"]}
    steps = newcomer_steps()
    assert [target for target, _ in steps] == [
        "shell", "tokens/models.py", "mysite/settings.py, appended", "tokens/apps.py",
        "mysite/urls.py", "shell", "second terminal", "shell"]

    outputs, skipped = {}, []
    for target, code in steps:
        if target == "second terminal":
            assert code == "python manage.py qcluster\n"
            continue
        if target != "shell":
            path, _, how = target.partition(", ")
            with (project / path).open("a" if how == "appended" else "w") as file:
                file.write(("\n" if how == "appended" else "") + code)
            continue
        for line in code.splitlines():
            if line.startswith(NOT_RUN):
                skipped.append(line.split()[0 if line.startswith("createdb") else 3])
                continue
            if "cleanup_dispatch" in line:
                shell(f"python manage.py shell -c '{SEED_TOKENS}'", project, env)
            command = re.match(r"(?:python manage\.py|django-admin) (\w+)", line)[1]
            outputs[command] = shell(line, project, env)

    assert skipped == ["install", "createdb"]
    assert list(outputs) == ["startproject", "startapp", "makemigrations", "migrate", "check",
                             "cleanup_schedule", "cleanup_dispatch", "cleanup_status"]
    assert (project / "tokens" / "migrations" / "0001_initial.py").exists()
    assert outputs["check"] == "System check identified no issues (0 silenced).\n"
    assert "cleanup:expire-tokens" in outputs["cleanup_schedule"]
    # Quiet, as the docs say: its one line, not the engine's INFO lines (a host that does
    # not configure structlog once got them all on stdout).
    assert len(outputs["cleanup_dispatch"].splitlines()) == 1
    assert "applied here: 5 of 5 rows deleted in 1 chunk" in outputs["cleanup_dispatch"]
    assert outputs["cleanup_dispatch"].rstrip().endswith("s.")
    assert "State completed" in outputs["cleanup_dispatch"]
    assert re.match(r"Run \S+ \(expire-tokens, range\): completed\n",
                    outputs["cleanup_status"])
    with psycopg.connect(host=env["PGHOST"], port=env["PGPORT"], user=env["PGUSER"],
                         dbname=env["PGDATABASE"]) as connection:
        left = connection.execute(
            "SELECT count(*), count(*) FILTER (WHERE expires_at > now()) FROM tokens_token"
        ).fetchone()
    assert left == (3, 3)  # every expired token gone, every other one kept
