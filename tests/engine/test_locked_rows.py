"""A few rows locked elsewhere never stall a policy: past CLEANUP_ROW_LOCK_WAIT_MS a
chunk goes on without them, by the same single statement carrying its whole predicate,
counts them apart ("skipped: locked"), and a later run takes them once they are free.

transaction=True: the locks are held from a second connection.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from cleanup.engine.dispatch import dispatch
from cleanup.engine.worker import Outcome, apply_chunk
from cleanup.models import Chunk, Run
from tests.engine.test_concurrency import Worker
from tests.engine.test_window import drain
from tests.engine_app.factories import LeaseFactory
from tests.engine_app.models import Lease, LeaseLog
from tests.engine_app.policies import EXPIRE_LEASES, EXPIRE_LEASES_RANGE, FLAG_LEASES
from tests.engine_app.services import renew_lease
from tests.observability.test_metrics import scrape, value

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def held_elsewhere(pks, change=None):
    """Keep these leases' rows locked (and, with ``change``, changed) from a second
    connection until the block ends; ``change`` commits then."""
    ready, release = threading.Event(), threading.Event()

    def hold():
        with transaction.atomic():
            list(Lease.objects.select_for_update().filter(pk__in=pks))
            for pk in pks:
                if change is not None:
                    change(pk)
            ready.set()
            assert release.wait(60)

    holder = Worker(hold)
    holder.start()
    assert ready.wait(10)
    try:
        yield
    finally:
        release.set()
        holder.outcome()


def applied(message) -> tuple[Outcome, float]:
    started = time.monotonic()
    outcome = apply_chunk(message)
    return outcome, time.monotonic() - started


@pytest.mark.parametrize("policy", [EXPIRE_LEASES, EXPIRE_LEASES_RANGE, FLAG_LEASES])
def test_rows_locked_past_the_wait_are_skipped_and_every_other_row_changes(account, policy):
    leases = LeaseFactory.create_batch(6, account=account, expired=True)
    locked = [leases[1].pk, leases[4].pk]
    chunk = dispatch(policy).run.chunks.get()

    with held_elsewhere(locked):
        outcome, took = applied(chunk.message)
        chunk.refresh_from_db()
        # It did not wait out the 5 s lock timeout, nor retry with backoff.
        assert took < 2.5
        assert outcome == (Outcome.UPDATED if policy == FLAG_LEASES else Outcome.DELETED)
        assert (chunk.state, chunk.rows_deleted + chunk.rows_updated, chunk.rows_locked,
                chunk.items_skipped, chunk.failures) == ("committed", 4, 2, 0, 0)
        if policy == FLAG_LEASES:
            flagged = set(Lease.objects.filter(notice="due").values_list("pk", flat=True))
            assert flagged == {lease.pk for lease in leases} - set(locked)
        else:
            assert set(Lease.objects.values_list("pk", flat=True)) == set(locked)
        if policy == EXPIRE_LEASES_RANGE:
            # The hook saw exactly the rows the DELETE removed, not the skipped ones.
            assert sorted(LeaseLog.objects.values_list("lease_id", flat=True)) == sorted(
                lease.pk for lease in leases if lease.pk not in locked)

    # Once free, the next run takes them; the ledger says what happened to each row.
    run = dispatch(policy).run
    drain(policy)
    run.refresh_from_db()
    assert run.state == Run.State.COMPLETED
    changed = Chunk.objects.filter(run__policy=policy)
    totals = [(c.rows_deleted + c.rows_updated, c.rows_locked) for c in changed]
    assert sum(n for n, _ in totals) == 6
    if policy == FLAG_LEASES:
        assert Lease.objects.filter(notice="due").count() == 6
    else:
        assert not Lease.objects.exists()


def test_a_renewal_holding_its_row_is_skipped_and_survives_its_commit(account):
    lease, *others = LeaseFactory.create_batch(3, account=account, expired=True)
    chunk = dispatch(EXPIRE_LEASES).run.chunks.get()

    with held_elsewhere([lease.pk], change=renew_lease):
        assert apply_chunk(chunk.message) == Outcome.DELETED

    lease.refresh_from_db()
    assert lease.state == "active" and lease.expires_at > chunk.run.cutoff
    chunk.refresh_from_db()
    assert (chunk.rows_deleted, chunk.rows_locked) == (2, 1)
    # Renewed, it is no longer eligible: the next run has nothing to do.
    assert dispatch(EXPIRE_LEASES).run.candidates == 0


def test_the_statement_that_skips_keeps_the_whole_predicate_in_its_own_where(account):
    leases = LeaseFactory.create_batch(2, account=account, expired=True)
    chunk = dispatch(EXPIRE_LEASES).run.chunks.get()

    with held_elsewhere([leases[0].pk]), CaptureQueriesContext(connection) as queries:
        apply_chunk(chunk.message)

    deletes = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("DELETE")]
    # The first waited 50 ms and gave up; the second skipped the locked row.
    assert len(deletes) == 2
    outer, _, inner = deletes[1].partition(" IN (SELECT ")
    assert "FOR UPDATE SKIP LOCKED" in inner
    for column in ('"state" = ', '"expires_at" <= '):
        assert column in outer, deletes[1]


def test_the_run_and_metrics_count_the_rows_skipped_locked_apart(account, client):
    leases = LeaseFactory.create_batch(4, account=account, expired=True)
    run = dispatch(EXPIRE_LEASES).run

    with held_elsewhere([leases[0].pk, leases[2].pk]):
        drain(EXPIRE_LEASES)

    out = StringIO()
    call_command("cleanup_status", str(run.pk), stdout=out)
    assert "skipped: locked 2 (kept locked by another transaction" in out.getvalue()
    assert "2 rows deleted, 0 skipped (no longer eligible)" in out.getvalue()
    assert value(scrape(client), "cleanup_rows_locked_total", policy=EXPIRE_LEASES) == 2


def test_a_lock_held_through_the_skipping_attempt_is_still_retried(settings, account):
    """A lock the skipping statement cannot get past either (the whole table's) is
    retried as a lock timeout always was, and never counted as rows skipped."""
    settings.CLEANUP_LOCK_TIMEOUT_MS = 100
    settings.CLEANUP_TRANSIENT_RETRIES = 8
    settings.CLEANUP_TRANSIENT_BACKOFF = 0.05
    LeaseFactory.create_batch(2, account=account, expired=True)
    chunk = dispatch(EXPIRE_LEASES).run.chunks.get()
    ready, release = threading.Event(), threading.Event()

    def lock_table():
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f'LOCK TABLE "{Lease._meta.db_table}" IN ACCESS EXCLUSIVE MODE')
            ready.set()
            assert release.wait(30)

    holder = Worker(lock_table)
    holder.start()
    assert ready.wait(10)
    delivery = Worker(apply_chunk, chunk.message)
    delivery.start()
    time.sleep(0.5)
    release.set()
    holder.outcome()

    assert delivery.outcome() == Outcome.DELETED
    chunk.refresh_from_db()
    assert (chunk.rows_deleted, chunk.rows_locked) == (2, 0)
    assert chunk.transient_retries >= 2


def test_a_sync_dispatch_says_how_many_rows_it_left_locked(account):
    leases = LeaseFactory.create_batch(3, account=account, expired=True)
    out = StringIO()

    with held_elsewhere([leases[1].pk]):
        call_command("cleanup_dispatch", "--policy", EXPIRE_LEASES, "--sync", stdout=out)

    assert ("applied here: 2 of 3 rows deleted in 1 chunk, 1 skipped: locked by another "
            "transaction (a later run takes them). State completed") in out.getvalue()
