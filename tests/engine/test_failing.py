"""A run whose chunks mostly fail halts its policy itself (reason ``failing``, with the
failures' common cause) instead of dead-lettering its whole backlog; the run stays
open, the alert's gauge names the cause, and an operator's resume after the fix goes
on from where it stopped."""

from __future__ import annotations

import contextlib
import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection

from cleanup.engine import halts, operations
from cleanup.engine.dispatch import dispatch
from cleanup.engine.worker import apply_chunk
from cleanup.models import Chunk, Halt, Run
from tests.engine.test_window import drain, unfinished
from tests.engine_app.factories import LeaseFactory
from tests.engine_app.models import Lease
from tests.observability.test_metrics import scrape

pytestmark = pytest.mark.django_db
POLICY = "expire-leases"
TABLE = Lease._meta.db_table


@pytest.fixture
def backlog(account, settings, chunk_size):
    """Forty expired leases, chunks of one, two in flight, the last ten chunks weighed."""
    settings.CLEANUP_WINDOW = 2
    settings.CLEANUP_FAILING_CHUNKS = 10
    chunk_size(POLICY, 1)
    return LeaseFactory.create_batch(40, account=account, expired=True)


@pytest.fixture
def deletes_refused():
    """The database rejects every DELETE of a lease (a deploy's trigger gone wrong)."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE FUNCTION refuse_lease_deletes() RETURNS trigger LANGUAGE plpgsql "
                       "AS $$ BEGIN RAISE EXCEPTION 'lease deletes are refused'; END $$")
        cursor.execute(f'CREATE TRIGGER refuse BEFORE DELETE ON "{TABLE}" '
                       "FOR EACH ROW EXECUTE FUNCTION refuse_lease_deletes()")

    def fix():
        with connection.cursor() as cursor:
            cursor.execute(f'DROP TRIGGER IF EXISTS refuse ON "{TABLE}"')
    yield fix
    fix()


def test_a_run_whose_chunks_mostly_fail_halts_its_policy_with_their_cause(
        backlog, deletes_refused, client):
    run = dispatch(POLICY).run
    drain()

    run.refresh_from_db()
    halt = Halt.objects.get(policy=POLICY, ended_at__isnull=True)
    dead = Chunk.objects.filter(run=run, state=Chunk.State.DEAD_LETTERED).count()
    # Six dead letters of ten weighed halted it; the one in flight then also failed.
    assert (halt.reason, halt.actor, dead, run.chunks_planned) == ("failing", "engine", 7, 7)
    assert run.state == Run.State.RUNNING and not run.planned_all
    assert halt.cause == "ProgrammingError: lease deletes are refused"
    assert halt.detail == ("6 of the policy's last 6 chunks were dead-lettered, 6 of them "
                           "for: ProgrammingError: lease deletes are refused")
    assert Lease.objects.count() == 40
    samples = scrape(client)
    assert samples["cleanup_policy_failing", frozenset(
        {"policy": POLICY, "cause": halt.cause}.items())] == 6
    out = StringIO()
    call_command("cleanup_status", str(run.pk), stdout=out)
    assert "failing" in out.getvalue() and "halted until resumed" in out.getvalue()


def test_a_resume_after_the_fix_goes_on_from_where_the_run_stopped(backlog, deletes_refused):
    run = dispatch(POLICY).run
    drain()
    deletes_refused()  # the fix
    call_command("cleanup_requeue", str(run.pk), "--noinput", stdout=StringIO())

    out = StringIO()
    call_command("cleanup_resume", "--policy", POLICY, "--json", stdout=out)
    result = json.loads(out.getvalue())
    assert (result["resumed"], result["reason"]) == (True, "failing")
    drain()

    run.refresh_from_db()
    assert run.state == Run.State.COMPLETED
    assert not Lease.objects.exists()
    assert not Halt.objects.filter(ended_at__isnull=True).exists()
    assert Halt.objects.get().ended_by.startswith("command")  # and the OS user
    assert sum(Chunk.objects.filter(run=run).values_list("rows_deleted", flat=True)) == 40


def test_short_runs_that_all_fail_halt_their_policy_together(
        account, settings, chunk_size, deletes_refused):
    """Minutely runs of one chunk each, every one dead-lettered: the policy's last
    chunks are weighed across its runs, so the sixth of ten halts it. Each run, all its
    chunks planned, ends with its dead letter."""
    settings.CLEANUP_FAILING_CHUNKS = 10
    chunk_size(POLICY, 1)
    LeaseFactory(account=account, expired=True)  # refused, so each run tries it again
    runs = []
    while not Halt.objects.filter(policy=POLICY, ended_at__isnull=True).exists():
        assert len(runs) < 10, "ten runs all dead-lettered and the policy still works"
        runs.append(dispatch(POLICY).run)
        drain()
    halt = Halt.objects.get(policy=POLICY)
    assert (len(runs), halt.reason, halt.value) == (6, "failing", 6)
    assert halt.detail == ("6 of the policy's last 6 chunks were dead-lettered, 6 of them "
                           "for: ProgrammingError: lease deletes are refused")
    assert {Run.objects.get(pk=run.pk).state for run in runs} == {
        Run.State.COMPLETED_WITH_DEAD_LETTERS}


def test_the_failures_before_a_resume_are_not_weighed_again(backlog, deletes_refused):
    """Resumed without a fix, it fails again: a new halt once more than half of the
    chunks ended since the resume failed, not at the first dead letter."""
    dispatch(POLICY)
    drain()
    operations.resume_policy(POLICY, actor="alice")
    apply_chunk(unfinished()[0].message)
    assert not Halt.objects.filter(ended_at__isnull=True).exists()
    drain()
    assert Halt.objects.filter(reason="failing").count() == 2
    assert Halt.objects.filter(ended_at__isnull=True).get().value == 6


def test_half_of_the_last_chunks_failing_is_not_failing(backlog, account):
    """A run whose chunks fail one in two goes on: only more than half halts it."""
    run = dispatch(POLICY).run
    for number, chunk in enumerate(iter(lambda: next(iter(unfinished()), None), None)):
        if number % 2:
            Lease.objects.filter(pk__in=[pk for pk, _ in chunk.message["items"]]).update(
                state="active")
            apply_chunk(chunk.message)
        else:
            apply_chunk({**chunk.message, "items": "not items"})  # refused: dead-lettered
    run.refresh_from_db()
    assert not Halt.objects.exists()
    assert run.chunks_planned == 40


@pytest.mark.django_db(transaction=True)  # the table's lock is held from a second connection
def test_a_table_locked_past_the_retries_halts_the_policy_for_its_lock_timeout(
        backlog, settings):
    """Each chunk waits out the lock timeout, is retried, redelivered and dead-lettered
    as poison; once most of the last ten are, the policy halts with that cause."""
    import threading

    from django.db import OperationalError, transaction

    from tests.engine.test_concurrency import Worker

    settings.CLEANUP_LOCK_TIMEOUT_MS = 50
    settings.CLEANUP_TRANSIENT_RETRIES = 0
    settings.CLEANUP_MAX_UNFINISHED_DELIVERIES = 1
    run = dispatch(POLICY).run
    ready, release = threading.Event(), threading.Event()

    def lock_table():
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f'LOCK TABLE "{TABLE}" IN SHARE MODE')  # a migration's, say
            ready.set()
            assert release.wait(60)

    holder = Worker(lock_table)
    holder.start()
    assert ready.wait(10)
    try:
        while chunks := unfinished():
            with contextlib.suppress(OperationalError):  # the broker delivers it again
                apply_chunk(chunks[0].message)
    finally:
        release.set()
        holder.outcome()

    halt = Halt.objects.get(policy=POLICY, ended_at__isnull=True)
    run.refresh_from_db()
    assert (halt.reason, halt.cause) == (
        "failing", "OperationalError: canceling statement due to lock timeout")
    assert run.state == Run.State.RUNNING and run.chunks_planned == 7
    assert Lease.objects.count() == 40


def test_weighing_a_dead_letter_takes_two_statements(backlog, django_assert_num_queries):
    run = dispatch(POLICY).run
    # The run's policy, its failing halt and its last resume in one; its last chunks.
    with django_assert_num_queries(2):
        assert halts.weigh_failing(run.pk) is None
