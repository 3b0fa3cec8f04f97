"""Causes named right: a chunk whose deliveries kept failing on a transient error that
never cleared (a lock held for an hour, a connection killed at each try) is
dead-lettered as transient, apart from real poison (a chunk that kills its worker); and
once a chunk committed after all, its old cause shows as past."""

from __future__ import annotations

import contextlib
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import OperationalError
from django.urls import reverse

from cleanup import faults
from cleanup.engine import operations, outcomes
from cleanup.engine.dispatch import dispatch
from cleanup.engine.worker import Outcome, apply_chunk
from cleanup.models import Chunk

pytestmark = pytest.mark.django_db
LOCK_TIMEOUT = "OperationalError: canceling statement due to lock timeout"


def lock_timeout():
    raise OperationalError("canceling statement due to lock timeout")


@pytest.fixture
def never_clears(settings, expired_leases):
    """A chunk delivered until the limit, each delivery ending on a lock timeout."""
    settings.CLEANUP_TRANSIENT_RETRIES = 0
    settings.CLEANUP_MAX_UNFINISHED_DELIVERIES = 2
    chunk = dispatch("expire-leases").run.chunks.get()
    with faults.injected(faults.BEFORE_CHUNK_LOCK, lock_timeout):
        for _ in range(2):
            with contextlib.suppress(OperationalError):  # the broker delivers it again
                apply_chunk(chunk.message)
        assert apply_chunk(chunk.message) == Outcome.DEAD_LETTERED
    chunk.refresh_from_db()
    return chunk


def test_a_transient_error_that_never_cleared_is_not_called_poison(never_clears, admin_client):
    chunk = never_clears
    assert (chunk.failure_class, chunk.cause) == (Chunk.FailureClass.TRANSIENT, LOCK_TIMEOUT)
    assert chunk.verdict == ("2 deliveries started without completing (limit 2): its "
                             "transient error never cleared")
    # The console's "Transient database error" filter finds it.
    page = admin_client.get(reverse("admin:cleanup_chunk_changelist"),
                            {"state": "dead_lettered", "failure_class": "transient"})
    assert LOCK_TIMEOUT in page.content.decode()


def test_a_chunk_that_kills_its_worker_is_still_poison(settings, expired_leases):
    settings.CLEANUP_MAX_UNFINISHED_DELIVERIES = 2
    chunk = dispatch("expire-leases").run.chunks.get()
    Chunk.objects.filter(pk=chunk.pk).update(deliveries=2)  # both workers killed mid-chunk

    assert apply_chunk(chunk.message) == Outcome.DEAD_LETTERED
    chunk.refresh_from_db()
    assert chunk.failure_class == Chunk.FailureClass.POISON


def test_a_cause_shows_as_past_once_the_chunk_committed_after_all(never_clears, admin_client):
    chunk = never_clears
    operations.requeue([chunk.pk])
    assert apply_chunk(chunk.message) == Outcome.DELETED
    chunk.refresh_from_db()

    assert chunk.failure_summary.startswith(f"earlier: {LOCK_TIMEOUT}")
    out = StringIO()
    call_command("cleanup_chunks", str(chunk.run_id), stdout=out)
    assert f"earlier: {LOCK_TIMEOUT}"[:40] in out.getvalue()
    page = admin_client.get(reverse("admin:cleanup_chunk_changelist"),
                            {"run__id__exact": str(chunk.run_id)})
    assert "earlier: OperationalError" in page.content.decode()


def test_failures_alike_are_one_cause_whatever_row_or_value_their_message_names(
        expired_leases, chunk_size, caplog):
    """A trigger that names the row it refuses gives every chunk its own message; they
    are one cause (its numbers, UUIDs and quoted values taken out), each chunk keeping
    its whole message (issue 47, item 3). The worker's log line names the error."""
    chunk_size("expire-leases", 1)
    run = dispatch("expire-leases").run
    chunks = list(run.chunks.order_by("chunk_id"))[:3]
    for chunk, (pk, key) in zip(chunks, [(546401, "a"), (546402, "b"), (7, "c")],
                                strict=True):
        error = (f"Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                 f"psycopg.errors.RaiseException: archive_guard: hold {pk} ('{key}') "
                 "is still referenced by 4a5b7c1e-1234-4cde-8f00-000000000001")
        with caplog.at_level("WARNING", logger="cleanup.ledger"):
            outcomes.dead_lettered(chunk, error, Chunk.FailureClass.ERROR)

    dead = list(Chunk.objects.filter(pk__in=[c.pk for c in chunks]).order_by("chunk_id"))
    assert {chunk.cause for chunk in dead} == {
        "RaiseException: archive_guard: hold … (…) is still referenced by …"}
    assert "hold 546402 ('b')" in dead[1].last_error
    logged = [r.msg for r in caplog.records if isinstance(r.msg, dict)
              and r.msg.get("event") == "chunk dead-lettered"]
    assert [line["reason"] for line in logged] == [
        "RaiseException: archive_guard: hold 546401 ('a') is still referenced by "
        "4a5b7c1e-1234-4cde-8f00-000000000001",
        "RaiseException: archive_guard: hold 546402 ('b') is still referenced by "
        "4a5b7c1e-1234-4cde-8f00-000000000001",
        "RaiseException: archive_guard: hold 7 ('c') is still referenced by "
        "4a5b7c1e-1234-4cde-8f00-000000000001"]
