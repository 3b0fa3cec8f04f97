"""The README's "Install the engine in your project", followed as a newcomer would: a
fresh `django-admin startproject` with this checkout's virtualenv (where the engine is
installed), the section's code blocks written where their `<!-- newcomer: ... -->`
marks say, its commands run in order, against a PostgreSQL database of the test's own.
The rows the first run deletes are the ones the section's `manage.py shell -c` step makes.

Lines not run as written: the virtualenv's and `pip install` (the engine is installed in
this checkout's virtualenv already; tests/project/test_packaging.py installs the wheel
the section builds), the `export` of libpq's variables (the test sets the same names to
its own server), `createdb` (the test creates a uniquely named database and drops it
after) and the second terminal's `qcluster`, which stays in the foreground; the
section's `--sync` dispatch needs no cluster. `runserver` stays in the foreground too:
it is started on a free port rather than 8000, which another server may hold, and the
test logs in over HTTP as the section's superuser, opens the overview the section
names and reads /metrics before stopping it."""

from __future__ import annotations

import contextlib
import http.cookiejar
import os
import re
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psycopg

from tests.conftest import ROOT
from tests.project.test_packaging import host_database  # noqa: F401
from tests.project.test_project import section

SECTION = "Install the engine in your project"
MARKED_BLOCK = re.compile(r"^<!-- newcomer: (?P<target>[^>]+?) -->\n```\w*\n(?P<code>.*?)^```",
                          re.MULTILINE | re.DOTALL)
# The lines that set up what the test brings itself (see above), by how each begins.
NOT_RUN = {"python3 -m venv ": "venv", "python -m pip install ": "install",
           "export ": "export", "createdb ": "createdb"}
# Where the section says the console is, as the reader's server serves it.
CONSOLE_URL = re.compile(r"<http://127\.0\.0\.1:8000(/[\w/]*)>")


def newcomer_steps() -> list[tuple[str, str]]:
    """The section's marked code blocks, in order: (where it goes, its text)."""
    text = section(ROOT / "README.md", SECTION)
    return [(match["target"], match["code"]) for match in MARKED_BLOCK.finditer(text)]


def commands(code: str) -> list[str]:
    """A shell block's commands: one a line, a backslash at a line's end continuing it."""
    return re.split(r"(?<!\\)\n", code.rstrip("\n"))


def shell(line: str, project: Path, env: dict) -> str:
    result = subprocess.run(["bash", "-c", line], cwd=project, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, (line, result.stdout[-2000:], result.stderr[-3000:])
    return result.stdout


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def serving(line: str, project: Path, env: dict) -> Iterator[str]:
    """Run the section's server line on a free port until the block ends; yield its base URL."""
    port = free_port()
    server = subprocess.Popen(["bash", "-c", f"{line} 127.0.0.1:{port}"], cwd=project, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)  # its autoreloader's child goes with it
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, server.stdout.read()
            try:
                urllib.request.urlopen(f"{base}/admin/login/", timeout=5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "runserver did not answer in 60 s"
                time.sleep(0.2)
        yield base
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.communicate(timeout=30)


def logged_in(base: str, username: str, password: str) -> tuple[urllib.request.OpenerDirector,
                                                                 str]:
    """Log in through the admin's own form; return the session's opener and the index page."""
    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    form = opener.open(f"{base}/admin/login/", timeout=30).read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)[1]
    fields = {"csrfmiddlewaretoken": token, "username": username, "password": password,
              "next": "/admin/"}
    with opener.open(f"{base}/admin/login/", urllib.parse.urlencode(fields).encode(),
                     timeout=30) as index:
        assert index.url == f"{base}/admin/", index.url  # not the form again: logged in
        return opener, index.read().decode()


def test_the_readme_names_the_django_versions_pyproject_allows():
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (django,) = [spec for spec in dependencies if re.match(r"django\s*[<>=~!]", spec, re.I)]
    assert f"`{django}`" in section(ROOT / "README.md", SECTION)


def test_the_readme_installs_the_wheel_of_this_version():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert f"dist/seat_hold_cleanup-{version}-py3-none-any.whl" in section(ROOT / "README.md",
                                                                          SECTION)


def test_a_newcomer_following_the_readme_gets_a_first_cleanup_and_its_console(
        tmp_path, host_database):  # noqa: F811
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

    outputs, lines, skipped = {}, {}, []
    for target, code in steps:
        if target == "second terminal":
            assert code == "python manage.py qcluster\n"
            continue
        if target != "shell":
            path, _, how = target.partition(", ")
            with (project / path).open("a" if how == "appended" else "w") as file:
                file.write(("\n" if how == "appended" else "") + code)
            continue
        for line in commands(code):
            if begins := [start for start in NOT_RUN if line.startswith(start)]:
                skipped.append(NOT_RUN[begins[0]])
                if begins[0] == "export ":  # what the test's own environment supplies
                    exported = re.findall(r"\b(PG\w+)=", line)
                    assert exported == ["PGHOST", "PGPORT", "PGUSER"]
                continue
            command = re.search(r"(?:python manage\.py|django-admin) (\w+)", line)[1]
            lines[command] = line
            if command != "runserver":  # in the foreground: started below, on a free port
                outputs[command] = shell(line, project, env)

    assert skipped == ["venv", "install", "export", "createdb"]
    assert list(outputs) == ["startproject", "startapp", "makemigrations", "migrate", "check",
                             "cleanup_schedule", "shell", "cleanup_dispatch", "cleanup_status",
                             "createsuperuser"]
    assert (project / "tokens" / "migrations" / "0001_initial.py").exists()
    assert outputs["check"] == "System check identified no issues (0 silenced).\n"
    assert "cleanup:expire-tokens" in outputs["cleanup_schedule"]
    # Quiet, as the docs say: its one line, not the engine's INFO lines (a host that does
    # not configure structlog once got them all on stdout).
    assert len(outputs["cleanup_dispatch"].splitlines()) == 1
    assert "applied here: 3 of 3 rows deleted in 1 chunk" in outputs["cleanup_dispatch"]
    assert lines["cleanup_dispatch"].endswith("   # 3 of 3 rows deleted")  # what it says
    assert outputs["cleanup_dispatch"].rstrip().endswith("s.")
    assert "State completed" in outputs["cleanup_dispatch"]
    assert re.match(r"Run \S+ \(expire-tokens, range\): completed\n",
                    outputs["cleanup_status"])
    with psycopg.connect(host=env["PGHOST"], port=env["PGPORT"], user=env["PGUSER"],
                         dbname=env["PGDATABASE"]) as connection:
        left = connection.execute(
            "SELECT count(*), count(*) FILTER (WHERE expires_at > now()) FROM tokens_token"
        ).fetchone()
    assert left == (1, 1)  # every expired token gone, the other one kept

    assert lines["runserver"] == "python manage.py runserver"
    password = re.search(r"DJANGO_SUPERUSER_PASSWORD=(\S+)", lines["createsuperuser"])[1]
    username = re.search(r"--username (\S+)", lines["createsuperuser"])[1]
    console = CONSOLE_URL.findall(section(ROOT / "README.md", SECTION))
    assert console == ["/admin/", "/admin/cleanup/cleanupoverview/", "/metrics"]
    _, overview_path, metrics_path = console
    with serving(lines["runserver"], project, env) as base:
        opener, index = logged_in(base, username, password)
        assert f'href="{overview_path}"' in index and "Cleanup overview" in index
        with opener.open(base + overview_path, timeout=30) as overview:
            assert (overview.status, overview.url) == (200, base + overview_path)
            assert "expire-tokens" in overview.read().decode()
        with urllib.request.urlopen(base + metrics_path, timeout=30) as metrics:
            assert ('cleanup_rows_deleted_total{policy="expire-tokens"} 3.0'
                    in metrics.read().decode())
