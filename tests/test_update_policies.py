"""A policy may update instead of delete: one conditional UPDATE per chunk with the whole
predicate in its own WHERE, committed with the ledger; its assignments move a row out
of eligibility, so a second delivery changes nothing (system check cleanup.E012)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Q
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from cleanup.checks import check_policies
from cleanup.dispatch import dispatch
from cleanup.models import Chunk, Slot
from cleanup.policies import ITEMS, RANGE, Policy, registered
from cleanup.worker import Outcome, apply_chunk

pytestmark = pytest.mark.django_db


def fired_slots(cutoff):
    return Q(outcome=Slot.Outcome.FIRED, fired_at__lte=cutoff)


def settle_policy(**changes) -> Policy:
    """Old slots nobody dispatched, marked coalesced rather than deleted."""
    fields = {"name": "settle-fired-slots", "model_label": "cleanup.Slot",
              "eligible": fired_slots, "observed_field": "fired_at", "partition_field": None,
              "scheme": ITEMS, "chunk_size": 2, "update": {"outcome": Slot.Outcome.COALESCED}}
    return Policy(**(fields | changes))


@pytest.fixture
def slots(db):
    now = timezone.now()
    return [Slot.objects.create(policy="p", slot_at=now - timedelta(minutes=n),
                                fired_at=now - timedelta(minutes=n)) for n in range(1, 4)]


@pytest.mark.parametrize("scheme", [ITEMS, RANGE])
def test_each_chunk_is_one_update_carrying_the_whole_predicate(slots, scheme):
    with registered(settle_policy(scheme=scheme)):
        run = dispatch("settle-fired-slots").run
        with CaptureQueriesContext(connection) as queries:
            for chunk in Chunk.objects.filter(run=run).order_by("chunk_id"):
                assert apply_chunk(chunk.message) == Outcome.UPDATED

    statements = [q["sql"] for q in queries.captured_queries
                  if q["sql"].startswith(('UPDATE "cleanup_slot"', "DELETE"))]
    assert len(statements) == run.chunks.count() and all(
        s.startswith('UPDATE "cleanup_slot"') for s in statements)
    for statement in statements:
        where = statement.split(" WHERE ", 1)[1]
        assert 'FROM "cleanup_slot"' not in where  # no subquery over the table itself
        assert '"outcome" =' in where and '"fired_at" <=' in where
    assert set(Slot.objects.values_list("outcome", flat=True)) == {Slot.Outcome.COALESCED}
    assert sum(run.chunks.values_list("rows_updated", flat=True)) == 3
    assert sum(run.chunks.values_list("rows_deleted", flat=True)) == 0


def test_a_second_delivery_changes_nothing(slots):
    with registered(settle_policy()):
        chunk = dispatch("settle-fired-slots").run.chunks.order_by("chunk_id").first()
        assert apply_chunk(chunk.message) == Outcome.UPDATED
        after_first = dict(Slot.objects.values_list("pk", "outcome"))
        # Even were the ledger to let the delivery through again (it reads the chunk
        # as unfinished), the UPDATE's own WHERE no longer matches the rows it marked.
        Chunk.objects.filter(pk=chunk.pk).update(state=Chunk.State.ENQUEUED)

        assert apply_chunk(chunk.message) == Outcome.NOOP

    chunk.refresh_from_db()
    assert dict(Slot.objects.values_list("pk", "outcome")) == after_first
    assert (chunk.rows_updated, chunk.noop_deliveries) == (2, 1)


def test_the_update_spares_a_row_that_stopped_being_eligible_after_planning(slots):
    with registered(settle_policy()):
        chunk = dispatch("settle-fired-slots").run.chunks.order_by("chunk_id").first()
        planned = [pk for pk, _ in chunk.message["items"]]
        # A worker dispatched the first one meanwhile: its outcome moved on.
        Slot.objects.filter(pk=planned[0]).update(outcome=Slot.Outcome.STARTED)

        assert apply_chunk(chunk.message) == Outcome.UPDATED

    assert Slot.objects.get(pk=planned[0]).outcome == Slot.Outcome.STARTED
    assert Slot.objects.get(pk=planned[1]).outcome == Slot.Outcome.COALESCED
    chunk.refresh_from_db()
    assert (chunk.rows_updated, chunk.items_skipped) == (1, 1)


@pytest.mark.parametrize("update, refused", [
    ({"outcome": Slot.Outcome.COALESCED}, False),
    ({"outcome": Slot.Outcome.FIRED}, True),          # still eligible
    ({"dispatched_at": timezone.now()}, True),       # a field the filter ignores
])
def test_e012_refuses_assignments_that_leave_the_row_eligible(db, update, refused):
    with registered(settle_policy(update=update)):
        errors = [e for e in check_policies() if e.id == "cleanup.E012"]
    assert bool(errors) == refused


def test_an_update_needs_an_assignment_and_no_delete_hook():
    with pytest.raises(ValueError, match="at least one assignment"):
        settle_policy(update={})
    with pytest.raises(ValueError, match="no before_delete"):
        settle_policy(before_delete=lambda rows: None)
    assert settle_policy().mutation == "update"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("scheme", [ITEMS, RANGE])
def test_a_change_holding_the_row_lock_survives_a_waiting_update(scheme):
    """As for deletes: PostgreSQL re-checks the UPDATE's own WHERE against the row a
    concurrent transaction changed while the UPDATE waited for its lock."""
    import threading

    from tests.conftest import wait_for
    from tests.test_concurrency import Worker, hold_lock_while, waiting_statements

    now = timezone.now()
    slot = Slot.objects.create(policy="p", slot_at=now - timedelta(minutes=5),
                               fired_at=now - timedelta(minutes=5))
    with registered(settle_policy(scheme=scheme)):
        chunk = dispatch("settle-fired-slots").run.chunks.get()
        locked, release = threading.Event(), threading.Event()
        changer = Worker(hold_lock_while, slot.pk, locked, release, lambda pk: (
            Slot.objects.filter(pk=pk).update(outcome=Slot.Outcome.STARTED)))
        changer.start()
        assert locked.wait(10)
        updater = Worker(apply_chunk, chunk.message)
        updater.start()
        wait_for(lambda: waiting_statements('UPDATE "cleanup_slot"') == 1,
                 what="the chunk's UPDATE to wait on the row lock")
        release.set()

        assert changer.outcome() is None
        assert updater.outcome() == Outcome.NOOP

    assert Slot.objects.get(pk=slot.pk).outcome == Slot.Outcome.STARTED
    chunk.refresh_from_db()
    assert (chunk.state, chunk.rows_updated, chunk.items_skipped) == ("committed", 0, 1)
