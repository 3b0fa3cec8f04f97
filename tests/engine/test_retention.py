"""The engine purges its own ledger and django-q2's results, and counters never drop."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from django_q.models import Task

from cleanup.engine.dispatch import dispatch, dispatch_in_process
from cleanup.engine.worker import apply_chunk
from cleanup.models import Chunk, Run, Total
from cleanup.retention import PURGE_CHUNKS, PURGE_RUNS, PURGE_TASK_RESULTS
from tests.observability.test_metrics import scrape, value

pytestmark = pytest.mark.django_db
LEASES = {"policy": "expire-leases"}
OLD = timezone.now() - timedelta(days=40)
COUNTERS = ["cleanup_rows_deleted_total", "cleanup_deliveries_total", "cleanup_noop_total",
            "cleanup_chunks_committed_total", "cleanup_candidates_found_total",
            "cleanup_chunks_published_total", "cleanup_chunk_rows_count",
            "cleanup_chunk_transaction_seconds_count"]


@pytest.fixture
def old_run(expired_leases):
    run = dispatch("expire-leases").run
    chunk = run.chunks.get()
    apply_chunk(chunk.message)
    apply_chunk(chunk.message)
    Chunk.objects.filter(run=run).update(planned_at=OLD)
    Run.objects.filter(pk=run.pk).update(created_at=OLD - timedelta(days=2))
    return run


def counters(client) -> dict:
    samples = scrape(client)
    return {name: value(samples, name, **LEASES) for name in COUNTERS} | {
        "runs": value(samples, "cleanup_runs_total", trigger="command", **LEASES)}


def test_old_chunks_then_runs_are_purged_and_counters_keep_their_values(client, old_run):
    before = counters(client)
    assert before["cleanup_rows_deleted_total"] == 5

    dispatch_in_process(PURGE_CHUNKS)
    assert not Chunk.objects.filter(run=old_run).exists()
    assert counters(client) == before

    dispatch_in_process(PURGE_RUNS)
    assert not Run.objects.filter(pk=old_run.pk).exists()
    assert counters(client) == before
    assert Total.objects.get(family="policy", subject="expire-leases").figures[
        "rows_deleted"] == 5


def test_recent_and_unfinished_ledger_rows_stay(client, expired_leases):
    run = dispatch("expire-leases").run  # enqueued, not finished
    Chunk.objects.filter(run=run).update(planned_at=OLD)

    dispatch_in_process(PURGE_CHUNKS)
    dispatch_in_process(PURGE_RUNS)

    assert Chunk.objects.filter(run=run).exists() and Run.objects.filter(pk=run.pk).exists()


# The foreign key is checked at commit (Django's constraints are deferred): the test
# must commit for real to see the refusal.
@pytest.mark.django_db(transaction=True)
def test_a_run_whose_chunks_remain_is_not_deleted(old_run):
    Chunk.objects.filter(run=old_run).update(planned_at=timezone.now())  # not yet purged

    purge = dispatch_in_process(PURGE_RUNS).run

    assert Run.objects.filter(pk=old_run.pk).exists()
    chunk = purge.chunks.get()
    assert (chunk.state, chunk.failure_class) == ("dead_lettered", "error")
    assert "violates foreign key constraint" in chunk.last_error


def test_old_task_results_are_purged(db):
    now = timezone.now()
    for name, stopped in (("old", now - timedelta(days=8)), ("new", now)):
        Task.objects.create(id=name.ljust(32, "0"), name=name, func="math.floor",
                            started=stopped, stopped=stopped, success=False)

    dispatch_in_process(PURGE_TASK_RESULTS)

    assert list(Task.objects.values_list("name", flat=True)) == ["new"]


def test_old_slots_of_the_trigger_ledger_are_purged_and_recent_ones_stay(db):
    from cleanup.models import Slot
    from cleanup.retention import PURGE_SLOTS

    old = Slot.objects.create(policy="expire-leases", slot_at=OLD, fired_at=OLD)
    recent = Slot.objects.create(policy="expire-leases", slot_at=timezone.now())

    dispatch_in_process(PURGE_SLOTS)

    assert list(Slot.objects.values_list("pk", flat=True)) == [recent.pk]
    assert not Slot.objects.filter(pk=old.pk).exists()
