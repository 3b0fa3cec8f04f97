"""Races against real second connections.

These tests use django_db(transaction=True): each thread opens its own PostgreSQL
connection, and they must see one another's commits, which the default
transaction-per-test wrapper would hide.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone
from django_q.models import OrmQ

from cleanup import faults
from cleanup.engine.dispatch import dispatch
from cleanup.engine.worker import Outcome, apply_chunk
from cleanup.models import Chunk, Run
from tests.conftest import wait_for
from tests.engine_app.factories import AccountFactory, LeaseFactory
from tests.engine_app.models import Lease
from tests.engine_app.services import renew_lease

pytestmark = pytest.mark.django_db(transaction=True)


class Worker(threading.Thread):
    """Run a callable on its own database connection and keep its result or error."""

    def __init__(self, target, *args):
        super().__init__(daemon=True)
        self._call = (target, args)
        self.result = self.error = None

    def run(self) -> None:
        target, args = self._call
        try:
            self.result = target(*args)
        except BaseException as exc:  # noqa: B036 - reported by the test
            self.error = exc
        finally:
            connections.close_all()

    def outcome(self, timeout: float = 30):
        self.join(timeout)
        assert not self.is_alive(), "thread did not finish"
        if self.error:
            raise self.error
        return self.result


def waiting_statements(prefix: str) -> int:
    """Count other sessions whose statement starting with ``prefix`` waits in pg_locks."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(DISTINCT l.pid) FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
            "WHERE NOT l.granted AND a.query LIKE %s AND l.pid <> pg_backend_pid() "
            "AND a.datname = current_database()",
            [prefix + "%"],
        )
        return cursor.fetchone()[0]


def hold_lock_while(pk: int, ready: threading.Event, release: threading.Event, change):
    with transaction.atomic():
        change(pk)
        ready.set()
        assert release.wait(30)


@pytest.mark.usefixtures("row_locks_waited")
@pytest.mark.parametrize("scheme", ["items", "range"])  # range: over the whole table
def test_renewal_holding_the_row_lock_survives_a_waiting_delete(scheme):
    lease = LeaseFactory(expired=True)
    chunk = dispatch("expire-leases", scheme=scheme).run.chunks.get()
    renewed, release = threading.Event(), threading.Event()
    renewer = Worker(hold_lock_while, lease.pk, renewed, release, renew_lease)
    renewer.start()
    assert renewed.wait(10)

    deleter = Worker(apply_chunk, chunk.message)
    deleter.start()
    wait_for(lambda: waiting_statements("DELETE") == 1, what="the DELETE to wait on the row lock")
    release.set()

    assert renewer.outcome() is None
    assert deleter.outcome() == Outcome.NOOP
    assert Lease.objects.filter(pk=lease.pk).exists()
    chunk.refresh_from_db()
    assert (chunk.state, chunk.rows_deleted, chunk.items_skipped) == ("committed", 0, 1)


def test_subquery_delete_would_delete_the_renewed_hold():
    """Why the predicate must sit in the DELETE's own WHERE: the subquery is not re-checked."""
    lease = LeaseFactory(expired=True)
    table = Lease._meta.db_table
    renewed, release = threading.Event(), threading.Event()
    renewer = Worker(hold_lock_while, lease.pk, renewed, release, renew_lease)
    renewer.start()
    assert renewed.wait(10)

    def subquery_delete():
        with connection.cursor() as cursor:
            cursor.execute(
                f'DELETE FROM "{table}" WHERE id IN (SELECT id FROM "{table}" '
                "WHERE state = 'active' AND expires_at <= now())"
            )
            return cursor.rowcount

    deleter = Worker(subquery_delete)
    deleter.start()
    wait_for(lambda: waiting_statements("DELETE") == 1, what="the DELETE to wait on the row lock")
    release.set()

    renewer.outcome()
    assert deleter.outcome() == 1
    assert not Lease.objects.filter(pk=lease.pk).exists()


@pytest.mark.usefixtures("row_locks_waited")
def test_concurrent_deliveries_of_one_chunk_delete_and_count_each_row_once():
    leases = LeaseFactory.create_batch(4, expired=True)
    chunk = dispatch("expire-leases").run.chunks.get()
    locked, release = threading.Event(), threading.Event()
    # A third connection holds one lease's row lock so the first delivery's DELETE
    # waits while the second delivery arrives.
    blocker = Worker(hold_lock_while, leases[0].pk, locked, release,
                     lambda pk: Lease.objects.select_for_update().get(pk=pk))
    blocker.start()
    assert locked.wait(10)

    deliveries = [Worker(apply_chunk, chunk.message) for _ in range(2)]
    for delivery in deliveries:
        delivery.start()
    wait_for(lambda: waiting_statements("DELETE") == 1, what="the first DELETE to wait")
    wait_for(lambda: waiting_statements("SELECT") >= 1, what="the duplicate to wait")
    release.set()

    blocker.outcome()
    outcomes = sorted(d.outcome() for d in deliveries)
    assert outcomes == [Outcome.DELETED, Outcome.NOOP]
    chunk.refresh_from_db()
    assert (chunk.rows_deleted, chunk.deliveries, chunk.noop_deliveries) == (4, 2, 1)
    assert Lease.objects.count() == 0


def test_lock_timeout_is_retried_inside_the_task(settings):
    """A lock no row skipping gets past (the table's, taken by a migration, say) is
    waited for again inside the task."""
    settings.CLEANUP_LOCK_TIMEOUT_MS = 100
    settings.CLEANUP_TRANSIENT_RETRIES = 6
    settings.CLEANUP_TRANSIENT_BACKOFF = 0.05
    LeaseFactory(expired=True)
    chunk = dispatch("expire-leases").run.chunks.get()
    blocker, delivery, release = blocked_delivery(chunk, take=lock_table)
    time.sleep(0.3)  # longer than the lock timeout: that attempt must fail
    release.set()

    blocker.outcome()
    assert delivery.outcome() == Outcome.DELETED
    chunk.refresh_from_db()
    assert chunk.transient_retries >= 1
    assert (chunk.state, chunk.rows_deleted, chunk.failures) == ("committed", 1, 0)


def test_concurrent_dispatches_with_one_key_give_one_run():
    LeaseFactory.create_batch(3, account=AccountFactory(), expired=True)
    barrier = threading.Barrier(2)

    def dispatch_at_once():
        barrier.wait(10)
        return dispatch("expire-leases", key="nightly-2026-11-29")

    racers = [Worker(dispatch_at_once) for _ in range(2)]
    for racer in racers:
        racer.start()
    results = [r.outcome() for r in racers]

    assert sorted(r.created for r in results) == [False, True]
    assert results[0].run.pk == results[1].run.pk
    assert Run.objects.count() == 1
    assert Chunk.objects.count() == 1
    assert OrmQ.objects.count() == 1


def lock_table(_) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f'LOCK TABLE "{Lease._meta.db_table}" IN ACCESS EXCLUSIVE MODE')


def blocked_delivery(chunk: Chunk, lease_pk: int | None = None, *, take=None):
    """Start a delivery of ``chunk`` whose DELETE waits on ``lease_pk``'s row lock, or
    on what ``take`` locks."""
    locked, release = threading.Event(), threading.Event()
    take = take or (lambda pk: Lease.objects.select_for_update().get(pk=pk))
    blocker = Worker(hold_lock_while, lease_pk, locked, release, take)
    blocker.start()
    assert locked.wait(10)
    delivery = Worker(apply_chunk, chunk.message)
    delivery.start()
    wait_for(lambda: waiting_statements("DELETE") == 1, what="the DELETE to wait")
    return blocker, delivery, release


@pytest.mark.usefixtures("row_locks_waited")
def test_replay_while_a_chunk_commits_does_not_deadlock(chunk_size):
    from cleanup.engine.replay import replay

    chunk_size("expire-leases", 1)
    leases = LeaseFactory.create_batch(2, expired=True)
    run = dispatch("expire-leases").run
    first = run.chunks.get(chunk_id=1)
    blocker, delivery, release = blocked_delivery(first, leases[0].pk)

    replayed = Worker(replay, run.pk)
    replayed.start()
    assert replayed.outcome(timeout=10).resent == 2  # done while the chunk is mid-DELETE
    release.set()

    blocker.outcome()
    assert delivery.outcome() == Outcome.DELETED
    first.refresh_from_db()
    assert (first.transient_retries, first.failures) == (0, 0)


@pytest.mark.usefixtures("row_locks_waited")
def test_cancel_while_a_chunk_commits_keeps_its_work_and_cancels_the_rest(chunk_size):
    from cleanup.engine.operations import cancel

    chunk_size("expire-leases", 1)
    leases = LeaseFactory.create_batch(2, expired=True)
    run = dispatch("expire-leases").run
    blocker, delivery, release = blocked_delivery(run.chunks.get(chunk_id=1), leases[0].pk)

    cancelling = Worker(cancel, [run.pk])
    cancelling.start()
    wait_for(lambda: waiting_statements("SELECT") >= 1, what="cancel to wait for the chunk")
    release.set()

    blocker.outcome()
    assert delivery.outcome() == Outcome.DELETED
    assert cancelling.outcome().done == 1
    states = dict(run.chunks.values_list("chunk_id", "state"))
    assert states == {1: "committed", 2: "cancelled"}
    assert list(Lease.objects.values_list("pk", flat=True)) == [leases[1].pk]


@pytest.mark.usefixtures("row_locks_waited")
def test_a_chunk_committing_while_the_ledger_purge_waits_is_never_lost_from_counters(
        chunk_size):
    """The interleaving that once took cleanup_rows_deleted_total from 100 to 80: the
    purge's DELETE waits on one lock, and meanwhile another chunk in its range commits.
    The purge takes nothing from the counters, and leaves the chunk that was not
    finished when its statement began."""
    from cleanup.observability.counters import ledger_figures
    from cleanup.retention import PURGE_CHUNKS

    chunk_size("expire-leases", 1)
    leases = LeaseFactory.create_batch(3, expired=True)
    run = dispatch("expire-leases").run
    first, middle, last = run.chunks.order_by("pk")
    for done in (first, last):
        assert apply_chunk(done.message) == Outcome.DELETED
    run.chunks.update(planned_at=timezone.now() - timedelta(days=40))
    purge = dispatch(PURGE_CHUNKS).run.chunks.get()
    assert (purge.message["start_id"], purge.message["end_id"]) == (first.pk, last.pk + 1)

    locked_last, release_last = threading.Event(), threading.Event()
    holder = Worker(hold_lock_while, last.pk, locked_last, release_last,
                    lambda pk: Chunk.objects.select_for_update().get(pk=pk))
    holder.start()
    assert locked_last.wait(10)
    blocker, committing, release_hold = blocked_delivery(middle, leases[1].pk)
    purging = Worker(apply_chunk, purge.message)
    purging.start()
    wait_for(lambda: waiting_statements('DELETE FROM "cleanup_chunk"') == 1,
             what="the purge to wait on a lock")

    release_hold.set()  # the middle chunk commits while the purge waits
    blocker.outcome()
    assert committing.outcome() == Outcome.DELETED
    release_last.set()
    holder.outcome()
    assert purging.outcome() == Outcome.DELETED

    assert ledger_figures().sums["expire-leases"]["rows_deleted"] == 3
    assert list(Chunk.objects.filter(run=run).values_list("pk", "state")) == [
        (middle.pk, Chunk.State.COMMITTED)]


def test_slot_tasks_run_at_once_by_several_workers_make_one_run():
    """After a stall, the queued slot tasks of a policy run in a burst on several
    workers: the in-flight check holds the planning lock, so one run takes them all."""
    from cleanup.models import Slot
    from cleanup.tasks import dispatch_scheduled

    LeaseFactory.create_batch(3, expired=True)
    slot = timezone.now().replace(second=0, microsecond=0)
    locked, release = threading.Event(), threading.Event()

    def hold_planning_lock():
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                           ["cleanup:expire-leases"])
            locked.set()
            assert release.wait(30)

    holder = Worker(hold_planning_lock)
    holder.start()
    assert locked.wait(10)
    burst = [Worker(dispatch_scheduled, "expire-leases", (slot - timedelta(minutes=n)).isoformat())
             for n in (1, 2, 3)]
    for worker in burst:
        worker.start()
    wait_for(lambda: waiting_statements("SELECT pg_advisory_xact_lock") == 3,
             what="the three slot tasks to wait for the planning lock")
    release.set()
    holder.outcome()

    assert len({worker.outcome() for worker in burst}) == 1
    assert Run.objects.count() == 1
    assert sorted(Slot.objects.values_list("outcome", flat=True)) == [
        Slot.Outcome.COALESCED, Slot.Outcome.COALESCED, Slot.Outcome.STARTED]


def test_a_cancel_committed_while_a_delivery_waits_for_its_chunk_lock_stops_it():
    """The delivery reads its run's state once the chunk's lock is granted: a cancel
    that committed during the wait is seen, and nothing is deleted."""
    leases = LeaseFactory.create_batch(3, expired=True)
    run = dispatch("expire-leases").run
    chunk = run.chunks.get()
    locked, release = threading.Event(), threading.Event()

    def hold_the_chunk():  # as a duplicate delivery of the chunk does, in its transaction
        with transaction.atomic():
            # get() drops the default ordering, whose join would lock the run too.
            Chunk.objects.select_for_update().get(pk=chunk.pk)
            locked.set()
            assert release.wait(30)

    holder = Worker(hold_the_chunk)

    def lock_it_first():
        holder.start()
        assert locked.wait(10)

    with faults.injected(faults.BEFORE_CHUNK_LOCK, lock_it_first):
        delivery = Worker(apply_chunk, chunk.message)
        delivery.start()
        wait_for(lambda: waiting_statements("SELECT * FROM cleanup_chunk_begin_v1") == 1,
                 what="the delivery to wait for the chunk's lock")
        # Cancelled as cancel_runs leaves a run whose chunk a delivery holds.
        Run.objects.filter(pk=run.pk).update(state=Run.State.CANCELLED)
        release.set()
        assert holder.outcome() is None
        assert delivery.outcome() == Outcome.NOOP

    chunk.refresh_from_db()
    assert (chunk.state, chunk.rows_deleted) == (Chunk.State.CANCELLED, 0)
    assert Lease.objects.filter(pk__in=[lease.pk for lease in leases]).count() == 3
