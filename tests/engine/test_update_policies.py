"""A policy may update instead of delete: one conditional UPDATE per chunk with the whole
predicate in its own WHERE, committed with the ledger; its assignments move a row out
of eligibility, so a second delivery changes nothing (system check cleanup.E012)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from cleanup.checks import check_policies
from cleanup.engine.dispatch import dispatch
from cleanup.engine.worker import Outcome, apply_chunk
from cleanup.models import Chunk
from cleanup.policies import ITEMS, RANGE, Policy, get_policy, registered
from tests.engine_app.factories import LeaseFactory
from tests.engine_app.models import Lease
from tests.engine_app.services import keep_lease

pytestmark = pytest.mark.django_db
FLAG = "flag-leases"
TABLE = Lease._meta.db_table


def flag_policy(**changes) -> Policy:
    """Expired active leases whose notice is pending, marked due rather than deleted."""
    return replace(get_policy(FLAG), **({"scheme": ITEMS, "chunk_size": 2} | changes))


@pytest.fixture
def leases(account):
    now = timezone.now()
    return [LeaseFactory(account=account, expires_at=now - timedelta(minutes=n))
            for n in range(1, 4)]


@pytest.mark.parametrize("scheme", [ITEMS, RANGE])
def test_each_chunk_is_one_update_carrying_the_whole_predicate(leases, scheme):
    with registered(flag_policy(scheme=scheme)):
        run = dispatch(FLAG).run
        with CaptureQueriesContext(connection) as queries:
            for chunk in Chunk.objects.filter(run=run).order_by("chunk_id"):
                assert apply_chunk(chunk.message) == Outcome.UPDATED

    statements = [q["sql"] for q in queries.captured_queries
                  if q["sql"].startswith((f'UPDATE "{TABLE}"', "DELETE"))]
    assert len(statements) == run.chunks.count() and all(
        s.startswith(f'UPDATE "{TABLE}"') for s in statements)
    for statement in statements:
        where = statement.split(" WHERE ", 1)[1]
        assert f'FROM "{TABLE}"' not in where  # no subquery over the table itself
        assert '"notice" =' in where and '"state" =' in where and '"expires_at" <=' in where
    assert set(Lease.objects.values_list("notice", flat=True)) == {Lease.Notice.DUE}
    assert not Lease.objects.filter(noticed_at=None).exists()
    assert sum(run.chunks.values_list("rows_updated", flat=True)) == 3
    assert sum(run.chunks.values_list("rows_deleted", flat=True)) == 0


def test_a_second_delivery_changes_nothing(leases):
    with registered(flag_policy()):
        chunk = dispatch(FLAG).run.chunks.order_by("chunk_id").first()
        assert apply_chunk(chunk.message) == Outcome.UPDATED
        after_first = dict(Lease.objects.values_list("pk", "noticed_at"))
        # Even were the ledger to let the delivery through again (it reads the chunk
        # as unfinished), the UPDATE's own WHERE no longer matches the rows it marked.
        Chunk.objects.filter(pk=chunk.pk).update(state=Chunk.State.ENQUEUED)

        assert apply_chunk(chunk.message) == Outcome.NOOP

    chunk.refresh_from_db()
    assert dict(Lease.objects.values_list("pk", "noticed_at")) == after_first
    assert (chunk.rows_updated, chunk.noop_deliveries) == (2, 1)


def test_the_update_spares_a_row_that_stopped_being_eligible_after_planning(leases):
    with registered(flag_policy()):
        chunk = dispatch(FLAG).run.chunks.order_by("chunk_id").first()
        planned = [pk for pk, _ in chunk.message["items"]]
        # The first was kept meanwhile: a column the predicate reads, not the observed one.
        keep_lease(planned[0])

        assert apply_chunk(chunk.message) == Outcome.UPDATED

    assert Lease.objects.get(pk=planned[0]).notice == Lease.Notice.PENDING
    assert Lease.objects.get(pk=planned[1]).notice == Lease.Notice.DUE
    chunk.refresh_from_db()
    assert (chunk.rows_updated, chunk.items_skipped) == (1, 1)


@pytest.mark.parametrize("update, refused", [
    ({"notice": Lease.Notice.DUE}, False),
    ({"state": Lease.State.KEPT}, False),            # out through another condition
    ({"notice": Lease.Notice.PENDING}, True),        # still eligible
    ({"noticed_at": timezone.now()}, True),          # a field the filter ignores
])
def test_e012_refuses_assignments_that_leave_the_row_eligible(db, update, refused):
    with registered(flag_policy(update=update)):
        errors = [e for e in check_policies() if e.id == "cleanup.E012"]
    assert bool(errors) == refused


def test_an_update_needs_an_assignment_and_no_delete_hook():
    with pytest.raises(ValueError, match="at least one assignment"):
        flag_policy(update={})
    with pytest.raises(ValueError, match="no before_delete"):
        flag_policy(before_delete=lambda rows: None)
    assert flag_policy().mutation == "update"


@pytest.mark.usefixtures("row_locks_waited")
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("scheme", [ITEMS, RANGE])
def test_a_change_holding_the_row_lock_survives_a_waiting_update(scheme):
    """As for deletes: PostgreSQL re-checks the UPDATE's own WHERE against the row a
    concurrent transaction changed while the UPDATE waited for its lock."""
    import threading

    from tests.conftest import wait_for
    from tests.engine.test_concurrency import Worker, hold_lock_while, waiting_statements

    lease = LeaseFactory(expires_at=timezone.now() - timedelta(minutes=5))
    with registered(flag_policy(scheme=scheme)):
        chunk = dispatch(FLAG).run.chunks.get()
        locked, release = threading.Event(), threading.Event()
        changer = Worker(hold_lock_while, lease.pk, locked, release, keep_lease)
        changer.start()
        assert locked.wait(10)
        updater = Worker(apply_chunk, chunk.message)
        updater.start()
        wait_for(lambda: waiting_statements(f'UPDATE "{TABLE}"') == 1,
                 what="the chunk's UPDATE to wait on the row lock")
        release.set()

        assert changer.outcome() is None
        assert updater.outcome() == Outcome.NOOP

    lease.refresh_from_db()
    assert (lease.state, lease.notice) == (Lease.State.KEPT, Lease.Notice.PENDING)
    chunk.refresh_from_db()
    assert (chunk.state, chunk.rows_updated, chunk.items_skipped) == ("committed", 0, 1)
