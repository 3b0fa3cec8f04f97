"""No step of the engine waits out a lock: each statement waits at most
CLEANUP_LOCK_TIMEOUT_MS, the step gives up with nothing changed, and the give-up is
recorded with the session holding the lock, where an operator looks (the overview's
banner, /metrics), until the step next gets through."""

from __future__ import annotations

import time
from io import StringIO

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.urls import reverse

from cleanup import tasks
from cleanup.bounds import lock_bounded
from cleanup.engine.steps import StepBlocked, blocked_now, step
from cleanup.models import BlockedStep, Run, Slot
from cleanup.scheduling import schedules
from tests.conftest import database_url
from tests.engine_app.models import Lease
from tests.observability.test_metrics import scrape

POLICY = "expire-leases"
BOUND_MS = 300


def lock_timeout() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('lock_timeout')")
        return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)  # statements outside any transaction too
def test_every_statement_of_a_bounded_block_has_the_lock_bound_and_none_outside():
    with lock_bounded(BOUND_MS):
        assert lock_timeout() == f"{BOUND_MS}ms"  # its own transaction, begun with it
        with transaction.atomic():
            with pytest.raises(ZeroDivisionError), transaction.atomic():
                assert lock_timeout() == f"{BOUND_MS}ms"  # set in the savepoint
                raise ZeroDivisionError  # rolled back, and the bound with it
            assert lock_timeout() == f"{BOUND_MS}ms"  # set again
            assert lock_timeout() == f"{BOUND_MS}ms"
    assert lock_timeout() == "0"  # the session's own setting, never changed


@pytest.fixture
def reporter(settings):
    """A report's session holding the leases' table ACCESS EXCLUSIVE (it keeps even a
    SELECT waiting), with its own application name; released at the end."""
    settings.CLEANUP_LOCK_TIMEOUT_MS = BOUND_MS
    holder = psycopg.connect(database_url(), application_name="nightly-report")
    holder.execute(f'LOCK TABLE "{Lease._meta.db_table}" IN ACCESS EXCLUSIVE MODE')
    yield holder
    holder.close()


@pytest.mark.django_db(transaction=True)  # the lock is held by a second connection
def test_a_dispatch_behind_a_table_lock_gives_up_at_the_bound_and_names_the_holder(
        expired_leases, reporter, client, admin_user):
    started = time.monotonic()
    with pytest.raises(CommandError) as refused:
        call_command("cleanup_dispatch", "--policy", POLICY, stdout=StringIO())
    waited = time.monotonic() - started

    pid = reporter.info.backend_pid
    assert waited < 3  # not the lock's whole length
    assert str(refused.value) == (
        f"dispatch of {POLICY} gave up after waiting {BOUND_MS} ms for a lock held by "
        f"nightly-report (pid {pid}): AccessExclusiveLock on {Lease._meta.db_table}; "
        "nothing was changed, and it is tried again at its next turn")
    assert not Run.objects.exists()
    [blocked] = blocked_now()
    assert (blocked.step, blocked.policy, blocked.times, blocked.blocker_pid) == (
        "dispatch", POLICY, 1, pid)
    assert blocked.blocker_query.startswith("LOCK TABLE")

    # Where an operator looks: the gauge the alert reads, and the overview's banner.
    samples = scrape(client)
    labels = {"step": "dispatch", "policy": POLICY, "blocker": f"nightly-report (pid {pid})"}
    assert ("cleanup_step_blocked_seconds", frozenset(labels.items())) in samples
    client.force_login(admin_user)
    page = client.get(reverse("admin:cleanup_cleanupoverview_changelist")).content.decode()
    assert "Dispatch of expire-leases blocked by a lock" in page
    assert f"nightly-report (pid {pid})" in page

    with pytest.raises(CommandError):
        call_command("cleanup_dispatch", "--policy", POLICY, stdout=StringIO())
    assert BlockedStep.objects.get().times == 2

    reporter.rollback()  # the report ends: the next turn gets through, and says so
    call_command("cleanup_dispatch", "--policy", POLICY, stdout=StringIO())
    assert Run.objects.count() == 1
    assert not BlockedStep.objects.exists()


@pytest.mark.django_db(transaction=True)  # the lock is held by a second connection
def test_a_scheduled_slot_behind_a_lock_stays_fired_and_its_task_says_what_blocked_it(
        expired_leases, reporter, expire_leases_scheduled):
    slot = "2026-12-05T10:00:00+00:00"
    said = tasks.dispatch_scheduled(POLICY, slot)

    assert said.startswith(f"dispatch of {POLICY} gave up after waiting {BOUND_MS} ms")
    assert "nightly-report" in said
    assert not Run.objects.exists()
    assert not Slot.objects.filter(outcome=Slot.Outcome.STARTED).exists()
    assert BlockedStep.objects.get().step == "dispatch"


@pytest.mark.django_db(transaction=True)  # the lock is held by a second connection
def test_a_host_task_runs_as_a_step_bounded_and_recorded(reporter, monkeypatch):
    monkeypatch.setitem(schedules._tasks, "count-leases",
                        ("tests.engine_app.services.count_leases", "* * * * *"))
    said = tasks.run_task("count-leases")

    assert said.startswith(f"count-leases gave up after waiting {BOUND_MS} ms for a lock "
                           "held by nightly-report")
    assert BlockedStep.objects.get().step == "count-leases"
    reporter.rollback()
    assert tasks.run_task("count-leases") == 0
    assert not BlockedStep.objects.exists()


@pytest.mark.django_db
def test_a_step_that_fails_otherwise_records_nothing():
    with pytest.raises(ZeroDivisionError), step("reconcile"):
        raise ZeroDivisionError
    with pytest.raises(StepBlocked), step("reconcile"), connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        raise StepBlocked(None, "inner", "")  # a step within a step passes it on
    assert not BlockedStep.objects.exists()
