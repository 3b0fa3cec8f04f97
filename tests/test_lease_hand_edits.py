"""A lease lasts no longer than its setting from its last renewal, whatever its row
says: an expiry an operator set by hand to ``infinity`` or a year ahead is no
renewal's, so the run of a --sync process that is gone is taken over all the same,
``cleanup_status`` does not say its process applies it, and a halted policy's recheck
is sent."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from cleanup.conf import conf
from cleanup.engine import dispatch as dispatch_module
from cleanup.engine import sync_lease, window
from cleanup.engine.dispatch import dispatch_in_process
from cleanup.engine.reconcile import reconcile
from cleanup.models import Chunk, Run
from cleanup.models import Lease as WorkLease

pytestmark = pytest.mark.django_db

TABLE = WorkLease._meta.db_table
GONE = "gone-host:4242:dead0000"
FOR_EVER = ["'infinity'", "clock_timestamp() + interval '1 year'"]
APPLIED_BY_ITS_PROCESS = "applied by the process that dispatched it (--sync), not the queue"
ITS_PROCESS_IS_GONE = ("dispatched with --sync, but its process is gone (its lease "
                       "lapsed): the reconciler (each minute) hands it to the queue")


def hand_edited_lease(name: str, expiry_sql: str) -> None:
    """The row a killed process left, its expiry then set by an operator's hand."""
    with connection.cursor() as cursor:
        cursor.execute(f'INSERT INTO "{TABLE}" (name, owner, taken_at, expires_at) '
                       f"VALUES (%s, %s, clock_timestamp() - interval '1 hour', {expiry_sql})",
                       [name, GONE])


@pytest.fixture
def abandoned_sync_run(expired_leases, monkeypatch) -> Run:
    """A --sync dispatch whose process died before applying its one chunk: the run is
    in process, its chunk planned and unsent, its lease given up on the way out."""

    def dies(run, progress=None):
        raise SystemExit("killed")

    monkeypatch.setattr(dispatch_module, "apply_in_process", dies)
    with pytest.raises(SystemExit):
        dispatch_in_process("expire-leases")
    run = Run.objects.get(in_process=True)
    assert [c.state for c in run.chunks.all()] == [Chunk.State.PLANNED]
    return run


def waiting_lines(run: Run) -> list[str]:
    out = StringIO()
    call_command("cleanup_status", str(run.pk), stdout=out)
    return [line.strip() for line in out.getvalue().splitlines()
            if line.strip().startswith("waiting:")]


@pytest.mark.parametrize("expiry_sql", FOR_EVER)
def test_a_sync_run_whose_lease_was_set_to_last_for_ever_is_taken_over(abandoned_sync_run,
                                                                      expiry_sql):
    run = abandoned_sync_run
    hand_edited_lease(sync_lease.name(run.pk), expiry_sql)

    result = reconcile()

    assert result.taken_over == 1
    run.refresh_from_db()
    chunk = run.chunks.get()
    assert (run.in_process, chunk.state) == (False, Chunk.State.ENQUEUED)
    assert [SignedPackage.loads(q.payload)["args"][0] for q in OrmQ.objects.all()] == [
        chunk.message]
    assert not WorkLease.objects.filter(name=sync_lease.name(run.pk)).exists()
    assert not {APPLIED_BY_ITS_PROCESS, ITS_PROCESS_IS_GONE} & {
        line.removeprefix("waiting: ") for line in waiting_lines(run)}


@pytest.mark.parametrize("expiry_sql", FOR_EVER)
def test_cleanup_status_says_a_process_is_gone_whatever_expiry_its_lease_row_says(
        abandoned_sync_run, expiry_sql):
    run = abandoned_sync_run
    hand_edited_lease(sync_lease.name(run.pk), expiry_sql)

    assert waiting_lines(run) == [f"waiting: {ITS_PROCESS_IS_GONE}"]


def test_cleanup_status_says_a_process_holding_its_lease_applies_its_run(
        abandoned_sync_run):
    run = abandoned_sync_run
    # Renewed a moment ago by a live process: its setting from now, at most.
    hand_edited_lease(sync_lease.name(run.pk),
                      f"clock_timestamp() + interval '{conf.SYNC_LEASE_SECONDS} s'")

    assert waiting_lines(run) == [f"waiting: {APPLIED_BY_ITS_PROCESS}"]
    assert reconcile().taken_over == 0


@pytest.mark.parametrize("expiry_sql", FOR_EVER)
def test_a_recheck_lease_set_to_last_for_ever_does_not_hold_a_halted_policys_recheck_back(
        db, expiry_sql):
    hand_edited_lease("recheck:expire-leases", expiry_sql)

    window.recheck_later("expire-leases")

    assert [SignedPackage.loads(q.payload)["func"] for q in OrmQ.objects.all()] == [
        window.RECHECK_TASK]
