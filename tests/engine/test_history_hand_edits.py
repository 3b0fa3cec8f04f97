"""A chunk's history is a record for people: whatever a hand edit left in it (an
object, a scalar, JSON null, entries that are not deliveries), every delivery still
starts, is counted and ends, and the chunk's page still shows.

The column is NOT NULL: PostgreSQL refuses a hand edit to SQL NULL, so JSON null is
the nearest an operator gets.
"""

from __future__ import annotations

import contextlib
import json

import pytest
from django.db import IntegrityError, OperationalError, connection, transaction
from django.urls import reverse
from django_q.models import OrmQ

from cleanup import faults
from cleanup.engine import leases
from cleanup.engine.dispatch import dispatch
from cleanup.models import Chunk
from tests.delivery import run_queued
from tests.engine_app.models import Lease

pytestmark = pytest.mark.django_db

TABLE = Chunk._meta.db_table
NOT_ARRAYS = ['{"a": 1}', "42", '"s"', "null"]
NOT_OBJECTS = '[7, "s", null, [1, 2], {"n": "x"}, {"outcome": 3}]'


def edit_history(chunk: Chunk, value: str) -> None:
    """The operator's hand edit: the value as jsonb text, written by raw SQL."""
    with connection.cursor() as cursor:
        cursor.execute(f'UPDATE "{TABLE}" SET history = %s::jsonb WHERE id = %s',
                       [value, chunk.pk])


def lock_timeout():
    raise OperationalError("canceling statement due to lock timeout")


def queued_chunk() -> Chunk:
    """expire-leases dispatched: one chunk, its message on the ORM broker's queue."""
    chunk = dispatch("expire-leases").run.chunks.get()
    assert OrmQ.objects.count() == 1
    return chunk


def deliver() -> dict:
    """The broker's delivery of the queued message, through django-q2's worker loop."""
    return run_queued(OrmQ.objects.get().pk)


@pytest.mark.parametrize("value", [*NOT_ARRAYS, NOT_OBJECTS])
def test_a_delivery_commits_whatever_the_history_was_edited_into(expired_leases, value):
    chunk = queued_chunk()
    edit_history(chunk, value)

    done = deliver()

    assert (done["success"], done["result"]) == (True, "deleted")
    assert not Lease.objects.filter(pk__in=[lease.pk for lease in expired_leases]).exists()
    chunk.refresh_from_db()
    assert (chunk.state, chunk.rows_deleted) == (Chunk.State.COMMITTED, 5)
    assert (chunk.deliveries, chunk.deliveries_completed) == (1, 1)
    [*before, entry] = chunk.history
    # An array's entries are kept as they were, whatever they are; anything else is none.
    assert before == ([] if value in NOT_ARRAYS else json.loads(value))
    assert (entry["n"], entry["worker"], entry["outcome"], entry["rows"]) == (
        1, leases.this_process(), "committed", 5)


@pytest.mark.parametrize("value", NOT_ARRAYS)
def test_a_history_edited_during_a_delivery_does_not_stop_its_end(expired_leases, value):
    chunk = queued_chunk()

    # Edited after the delivery's start committed, before its end is written.
    with faults.injected(faults.BEFORE_CHUNK_LOCK, lambda: edit_history(chunk, value)):
        done = deliver()

    assert (done["success"], done["result"]) == (True, "deleted")
    chunk.refresh_from_db()
    assert (chunk.state, chunk.rows_deleted, chunk.deliveries) == (
        Chunk.State.COMMITTED, 5, 1)
    assert chunk.history == []  # read as empty: the edit left no entry to end


@pytest.mark.parametrize("value", NOT_ARRAYS)
def test_deliveries_that_keep_failing_are_dead_lettered_at_the_limit_whatever_the_history(
        settings, expired_leases, value):
    settings.CLEANUP_TRANSIENT_RETRIES = 0
    settings.CLEANUP_MAX_UNFINISHED_DELIVERIES = 2
    chunk = queued_chunk()
    with faults.injected(faults.BEFORE_CHUNK_LOCK, lock_timeout):
        for _ in range(2):
            edit_history(chunk, value)
            with contextlib.suppress(OperationalError):  # the broker delivers it again
                deliver()
        edit_history(chunk, value)
        done = deliver()

    assert done["result"] == "dead_lettered"
    chunk.refresh_from_db()
    assert (chunk.state, chunk.failure_class, chunk.deliveries) == (
        Chunk.State.DEAD_LETTERED, Chunk.FailureClass.TRANSIENT, 3)
    [refused] = chunk.history
    assert (refused["n"], refused["outcome"]) == (3, "dead-lettered (transient)")


@pytest.mark.parametrize("value", [*NOT_ARRAYS, NOT_OBJECTS])
def test_the_chunk_page_shows_whatever_the_history_was_edited_into(expired_leases,
                                                                   admin_client, value):
    chunk = queued_chunk()
    Chunk.objects.filter(pk=chunk.pk).update(deliveries=2)
    edit_history(chunk, value)

    page = admin_client.get(reverse("admin:cleanup_chunk_change", args=[chunk.pk]))

    assert page.status_code == 200
    text = page.content.decode()
    assert "Deliveries (2)" in text
    understood = 0 if value in NOT_ARRAYS else 2  # its two objects, read as best they can be
    assert text.count('<tr class="unended">') == understood


def test_the_history_cannot_be_edited_into_sql_null(expired_leases):
    chunk = queued_chunk()
    with pytest.raises(IntegrityError), transaction.atomic():
        edit_history(chunk, None)
