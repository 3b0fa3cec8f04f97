"""Events written by the database from a statement's own rows (cleanup.outbox.triggers):
a chunk's one DELETE writes one event per row it removed, in its own transaction and
named for the chunk; a second delivery writes none; a chunk that rolls back leaves
none; a host's own DELETE fires the same trigger as the host's."""

from __future__ import annotations

import pytest
from django.db import connection

from cleanup import faults
from cleanup.engine.dispatch import dispatch
from cleanup.engine.worker import Outcome, apply_chunk
from cleanup.models import Chunk, Event
from cleanup.outbox.triggers import events_on_delete
from tests.engine_app.models import Lease

pytestmark = pytest.mark.django_db
TABLE = Lease._meta.db_table


@pytest.fixture
def lease_events():
    install, drop = events_on_delete(
        TABLE, "lease.ended", key="'lease:' || gone.id",
        ordering_key="'account:' || gone.account_id",
        payload="jsonb_build_object('lease_id', gone.id, 'holder', gone.holder)",
        when="gone.state = 'active'")
    with connection.cursor() as cursor:
        cursor.execute(install)
    yield
    with connection.cursor() as cursor:
        cursor.execute(drop)


def test_a_chunks_delete_writes_one_event_per_row_named_for_the_chunk(
        lease_events, expired_leases):
    chunk = dispatch("expire-leases").run.chunks.get()
    assert apply_chunk(chunk.message) == Outcome.DELETED

    events = list(Event.objects.order_by("key"))
    assert sorted(e.key for e in events) == sorted(f"lease:{lease.pk}"
                                                   for lease in expired_leases)
    assert {(e.name, e.state, e.source, e.run_id, e.chunk_id) for e in events} == {
        ("lease.ended", "pending", f"run {chunk.run_id} chunk 1", chunk.run_id, 1)}
    lease = expired_leases[0]
    [event] = [e for e in events if e.key == f"lease:{lease.pk}"]
    assert event.ordering_key == f"account:{lease.account_id}"
    assert event.payload == {"lease_id": lease.pk, "holder": lease.holder}


def test_a_second_delivery_of_the_chunk_writes_no_second_event(lease_events, expired_leases):
    chunk = dispatch("expire-leases").run.chunks.get()
    apply_chunk(chunk.message)
    assert apply_chunk(chunk.message) == Outcome.NOOP
    assert Event.objects.count() == len(expired_leases)


def test_a_chunk_that_rolls_back_leaves_no_event(lease_events, expired_leases):
    chunk = dispatch("expire-leases").run.chunks.get()

    def crash():
        raise RuntimeError("the worker died before its commit")

    with faults.injected(faults.BEFORE_COMMIT, crash):
        apply_chunk(chunk.message)  # a bug: dead-lettered, its DELETE rolled back

    assert Chunk.objects.get(pk=chunk.pk).state == Chunk.State.DEAD_LETTERED
    assert Lease.objects.count() == len(expired_leases)
    assert Event.objects.count() == 0


def test_a_hosts_own_delete_writes_the_event_as_the_hosts(lease_events, expired_leases):
    lease = expired_leases[0]
    Lease.objects.filter(pk=lease.pk).delete()

    event = Event.objects.get()
    assert (event.key, event.source, event.run_id, event.chunk_id) == (
        f"lease:{lease.pk}", "host", None, None)


def test_rows_the_condition_leaves_out_write_no_event(lease_events, expired_leases):
    Lease.objects.filter(pk=expired_leases[0].pk).update(state="ended")
    Lease.objects.all().delete()
    assert Event.objects.count() == len(expired_leases) - 1


def test_a_trigger_name_that_is_not_an_identifier_is_refused():
    with pytest.raises(ValueError, match="lower-case identifiers"):
        events_on_delete("leases; DROP TABLE x", "e", key="'k'", payload="'{}'::jsonb")
