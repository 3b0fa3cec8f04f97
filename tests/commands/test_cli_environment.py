"""What the environment does to a command: a database that cannot be reached, an email
backend that cannot be imported, and how much the logs say at each verbosity."""

from __future__ import annotations

import json
import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import OperationalError, connection, transaction

from cleanup.management.base import connection_failure
from reservations.checks import check_email_backend
from tests.conftest import ROOT, database_url, subprocess_env
from tests.engine_app.factories import LeaseFactory


def shell(*args: str, **env: str) -> subprocess.CompletedProcess:
    """Run ``manage.py`` as an operator does, stdout and stderr apart."""
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT,
                          env=subprocess_env(**env), capture_output=True, text=True,
                          timeout=120)


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


def test_an_email_backend_that_cannot_be_imported_fails_check_e002(settings):
    settings.EMAIL_BACKEND = "no.such.Backend"
    (error,) = check_email_backend()
    assert (error.id, error.msg) == (
        "reservations.E002", "EMAIL_BACKEND 'no.such.Backend' cannot be imported (No module "
        "named 'no'), so no reminder can be sent.")
    assert "DJANGO_EMAIL_BACKEND" in error.hint
    settings.EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"
    assert check_email_backend() == []


@pytest.mark.django_db
def test_a_bad_email_backend_stops_the_sender_with_the_check_not_a_traceback():
    result = shell("send_reminders", DJANGO_EMAIL_BACKEND="no.such.Backend")
    assert (result.returncode, result.stdout) == (1, "")
    assert "Traceback" not in result.stderr
    assert ("(reservations.E002) EMAIL_BACKEND 'no.such.Backend' cannot be imported"
            in result.stderr)


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


@pytest.mark.django_db
def test_seeding_progress_is_plain_output_not_an_error(monkeypatch):
    def seed(progress, **counts):
        progress("holds", 100_000, 200_000)
        return dict.fromkeys(("tenants", "sections", "expired", "active", "confirmed",
                              "reminders", "attempts"), 0)

    monkeypatch.setattr("reservations.seeding.seed", seed)
    out, err = StringIO(), StringIO()
    call_command("seed_reservations", "--tenants", "1", "--expired", "200000", "--active",
                 "0", stdout=out, stderr=err)
    assert out.getvalue().splitlines()[0] == "  holds: 100,000/200,000"
    assert err.getvalue() == ""
