"""What the environment does to a command: a database that cannot be reached, and how
much the logs say at each verbosity."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from django.db import OperationalError, connection, transaction

from cleanup.management.base import connection_failure
from tests.conftest import ROOT, database_url, subprocess_env
from tests.engine_app.factories import LeaseFactory


def shell(*args: str, **env: str) -> subprocess.CompletedProcess:
    """Run ``manage.py`` as an operator does, stdout and stderr apart, with the settings
    the tests run with: manage.py's own (config.settings) lack the engine app, and with
    it the expire-leases and flag-leases policies dispatched below."""
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT,
                          env=subprocess_env(**env),
                          capture_output=True, text=True, timeout=120)


def unreachable(kind: str) -> tuple[str, str]:
    """A DATABASE_URL that parses but cannot connect, and what the refusal tells to fix."""
    name = connection.settings_dict["NAME"]
    if kind == "no such database":
        return (database_url() + "_missing",
                f'database "{name}_missing" does not exist; create it (createdb ')
    if kind == "closed port":
        return ("postgres://root:secret@127.0.0.1:1/x",
                "nothing accepts connections on 127.0.0.1:1: start PostgreSQL there or fix "
                "the host and port in DATABASE_URL")
    return ("postgres://root@no-such-host.invalid:5432/x",
            "no host is called 'no-such-host.invalid': fix the host in DATABASE_URL")


KINDS = ["no such database", "closed port", "unknown host"]


@pytest.mark.django_db
@pytest.mark.parametrize("kind", KINDS)
def test_a_database_that_cannot_be_reached_is_one_line_from_a_cleanup_command(kind):
    url, fix = unreachable(kind)
    result = shell("cleanup_runs", DATABASE_URL=url)
    assert (result.returncode, result.stdout) == (1, "")
    (line,) = result.stderr.splitlines()
    assert line.startswith("CommandError: cannot connect to the database postgres://")
    assert fix in line and "secret" not in line


@pytest.mark.django_db
@pytest.mark.parametrize("kind", KINDS)
def test_under_json_an_unreachable_database_is_one_json_object(kind):
    url, fix = unreachable(kind)
    result = shell("cleanup_status", "627b1823", "--json", DATABASE_URL=url)
    assert (result.returncode, result.stdout, result.stderr.count("\n")) == (1, "", 1)
    error = json.loads(result.stderr)["error"]
    assert error.startswith("cannot connect to the database postgres://") and fix in error


@pytest.mark.django_db
@pytest.mark.parametrize("kind", KINDS)
def test_any_manage_py_command_says_the_same_line_instead_of_a_traceback(kind):
    url, fix = unreachable(kind)
    result = shell("migrate", DATABASE_URL=url)
    assert (result.returncode, result.stdout) == (1, "")
    (line,) = result.stderr.splitlines()
    assert line.startswith("Database error: cannot connect to the database ") and fix in line


@pytest.mark.django_db
def test_a_statement_that_fails_once_connected_is_not_called_a_connection_failure():
    with pytest.raises(OperationalError) as failed, transaction.atomic(), \
            connection.cursor() as cursor:
        cursor.execute("SET LOCAL statement_timeout = 1")
        cursor.execute("SELECT pg_sleep(1)")
    assert connection_failure(failed.value) is None


# transaction=True: the command runs in another process, which must see the leases.
@pytest.mark.django_db(transaction=True)
def test_at_normal_verbosity_a_command_prints_its_result_and_no_info_lines(account):
    LeaseFactory.create_batch(3, account=account, expired=True)

    queued = shell("cleanup_dispatch", "--policy", "expire-leases", "--key", "quiet")
    assert queued.returncode == 0 and queued.stderr == ""
    assert queued.stdout.startswith("Dispatched run ") and queued.stdout.count("\n") == 1

    chatty = shell("cleanup_dispatch", "--policy", "expire-leases", "--key", "chatty", "-v", "2")
    assert chatty.returncode == 0
    assert "Enqueued [cleanup]" in chatty.stderr and "[cleanup.dispatch]" in chatty.stderr

    synced = shell("cleanup_dispatch", "--policy", "flag-leases", "--sync")
    assert synced.returncode == 0 and synced.stderr == ""
