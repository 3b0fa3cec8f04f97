"""The --sync lease is a row with an expiry, never a session lock: it lapses on the
database's clock when its owner stops renewing it, a taker ends it under the row's lock
so an owner renewing meanwhile finds it gone, and an owner that wakes up late applies
and counts nothing of a run that is no longer its own.

transaction=True: the owner and the taker are two real sessions.
"""

from __future__ import annotations

import time
from datetime import timedelta

import psycopg
import pytest
from django.db import transaction
from django.utils import timezone

from cleanup import faults
from cleanup.conf import conf
from cleanup.engine import leases, sync_lease, transitions
from cleanup.engine.dispatch import dispatch
from cleanup.engine.reconcile import reconcile
from cleanup.engine.worker import apply_chunk
from cleanup.exceptions import LeaseLost
from cleanup.models import Chunk, Run
from cleanup.models import Lease as WorkLease
from tests.conftest import database_url
from tests.engine_app.models import Lease

pytestmark = pytest.mark.django_db(transaction=True)

TABLE = WorkLease._meta.db_table


def other_session() -> psycopg.Connection:
    return psycopg.connect(database_url(), autocommit=True)


def lapse(name: str) -> None:
    WorkLease.objects.filter(name=name).update(expires_at=timezone.now() - timedelta(seconds=1))


def in_process_run(settings) -> Run:
    """A run dispatched for the queue, then claimed by this process as --sync does."""
    run = dispatch("expire-leases").run
    assert sync_lease.acquire(run.pk) and transitions.queued_to_in_process(run.pk)
    return run


def test_a_lease_lapses_on_the_database_clock_without_its_owner():
    assert leases.take("run:a", "owner-1", 0.2)
    assert not leases.take("run:a", "owner-2", 60)  # live: another owner is refused
    assert leases.take("run:a", "owner-1", 0.2)  # its owner may take it again
    time.sleep(0.3)
    assert leases.live(["run:a"], 0.2) == set()
    assert leases.take("run:a", "owner-2", 60)  # lapsed: anyone may take it
    assert not leases.renew("run:a", "owner-1", 60)  # and the old owner cannot renew it


def test_a_taker_cannot_end_a_live_lease(expired_leases):
    run = dispatch("expire-leases").run
    assert leases.take(sync_lease.name(run.pk), "another-host:1:live", conf.SYNC_LEASE_SECONDS)
    with transaction.atomic():
        assert not sync_lease.lapsed_in_transaction(run.pk)
    assert sync_lease.alive([run.pk]) == {run.pk}


def test_an_owner_renewing_during_a_takeover_finds_its_lease_gone(expired_leases):
    run = dispatch("expire-leases").run
    name = sync_lease.name(run.pk)
    assert leases.take(name, "owner", 60)
    lapse(name)
    owner = other_session()
    try:
        owner.execute("SET lock_timeout = '200ms'")  # this test's own session only
        with transaction.atomic():
            assert sync_lease.lapsed_in_transaction(run.pk)
            # The owner wakes up in the middle of the takeover: it waits for the row.
            with pytest.raises(psycopg.errors.LockNotAvailable):
                owner.execute(f"UPDATE {TABLE} SET expires_at = now() + interval '1 minute' "
                              "WHERE name = %s AND owner = 'owner'", [name])
        # Once the takeover commits there is nothing left to renew.
        renewed = owner.execute(f"UPDATE {TABLE} SET expires_at = now() WHERE name = %s "
                                "AND owner = 'owner' RETURNING 1", [name]).fetchone()
        assert renewed is None
    finally:
        owner.close()


def test_a_chunk_in_progress_keeps_a_takeover_waiting_until_it_commits(settings,
                                                                      expired_leases):
    run = in_process_run(settings)
    chunk = run.chunks.get(chunk_id=1)
    name = sync_lease.name(run.pk)
    waited = []

    def takeover_meanwhile():
        lapse_elsewhere = other_session()
        try:
            lapse_elsewhere.execute("SET lock_timeout = '200ms'")
            with pytest.raises(psycopg.errors.LockNotAvailable):
                lapse_elsewhere.execute(f"DELETE FROM {TABLE} WHERE name = %s", [name])
            waited.append(True)
        finally:
            lapse_elsewhere.close()

    with faults.injected(faults.BEFORE_COMMIT, takeover_meanwhile):
        apply_chunk(chunk.message, leased=True)

    assert waited == [True]
    chunk.refresh_from_db()
    assert chunk.state == Chunk.State.COMMITTED and chunk.rows_deleted == 5
    sync_lease.release(run.pk)


def test_an_owner_that_wakes_after_the_takeover_applies_and_counts_nothing(settings,
                                                                         expired_leases):
    run = in_process_run(settings)
    chunk = run.chunks.get(chunk_id=1)
    lapse(sync_lease.name(run.pk))  # the owner froze past its lease
    assert reconcile().taken_over == 1

    with pytest.raises(LeaseLost):
        apply_chunk(chunk.message, leased=True)

    chunk.refresh_from_db()
    assert chunk.state == Chunk.State.ENQUEUED  # the workers' now, and untouched
    # Not even counted as a delivery that started.
    assert (chunk.rows_deleted, chunk.noop_deliveries, chunk.deliveries) == (0, 0, 0)
    assert Lease.objects.count() == 5
    # The workers apply it once.
    apply_chunk(chunk.message)
    chunk.refresh_from_db()
    assert (chunk.state, chunk.rows_deleted) == (Chunk.State.COMMITTED, 5)


def test_the_rows_eligible_at_dispatch_are_recorded_once(expired_leases):
    run = dispatch("expire-leases").run
    run.refresh_from_db()
    assert run.eligible_at_dispatch == 5

    assert not transitions.record_eligible(run.pk, 99)
    run.refresh_from_db()
    assert run.eligible_at_dispatch == 5


def test_a_worker_that_froze_mid_chunk_loses_its_session_and_the_chunk_is_retried(
        settings, expired_leases):
    """The server ends a chunk's transaction left idle past its bound (a frozen worker),
    releasing its rows; the worker, waking up, retries on a new connection: the chunk
    commits once and is never dead-lettered for it."""
    settings.CLEANUP_IDLE_IN_TRANSACTION_TIMEOUT_MS = 300
    run = dispatch("expire-leases").run
    chunk = run.chunks.get(chunk_id=1)
    froze = []

    def freeze_once():
        if not froze:
            froze.append(True)
            time.sleep(1)  # idle in the transaction, past its 300 ms

    with faults.injected(faults.BEFORE_COMMIT, freeze_once):
        apply_chunk(chunk.message)

    chunk.refresh_from_db()
    assert (chunk.state, chunk.rows_deleted, chunk.transient_retries) == (
        Chunk.State.COMMITTED, 5, 1)
    assert Lease.objects.count() == 0
