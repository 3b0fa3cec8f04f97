"""The ledger's totals, counted by the database as each change commits
(cleanup/sql/totals_v1.sql), equal a count of every row, keep counting across purges,
never go down, and are counted when the change commits, not before.

Each test compares the totals /metrics reads with a count made here, in Python, over
every row: a second implementation the SQL must agree with.
"""

from __future__ import annotations

import re
from collections import defaultdict
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from django.db import connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

import cleanup
from cleanup.engine import operations
from cleanup.engine.dispatch import dispatch, dispatch_in_process
from cleanup.engine.replay import replay
from cleanup.engine.worker import apply_chunk
from cleanup.models import Chunk, Run, Total
from cleanup.observability.counters import DURATION_BUCKETS_MS, ROWS_BUCKETS, ledger_figures
from cleanup.retention import PURGE_CHUNKS, PURGE_RUNS
from tests.conftest import database_url
from tests.engine_app.factories import LeaseFactory

pytestmark = pytest.mark.django_db
TOTALS_SQL = Path(cleanup.__file__).parent / "sql" / "totals_v1.sql"


def reported() -> tuple[dict, dict, dict]:
    """The counters, chunk states and runs running a scrape reports (zeros left out)."""
    figures = ledger_figures()
    sums = {p: {k: v for k, v in values.items() if v} for p, values in figures.sums.items()}
    states = {p: {s: n for s, n in values.items() if n} for p, values in figures.states.items()}
    running = {p: n for p, n in figures.running.items() if n}
    return ({p: v for p, v in sums.items() if v}, {p: v for p, v in states.items() if v},
            running)


def chunk_figures(chunk: Chunk) -> dict:
    committed = chunk.committed_at is not None
    timed = committed and chunk.duration_ms is not None
    changed = chunk.rows_deleted + chunk.rows_updated
    figures = {
        "deliveries": chunk.deliveries, "rows_deleted": chunk.rows_deleted,
        "rows_updated": chunk.rows_updated, "noop_deliveries": chunk.noop_deliveries,
        "items_skipped": chunk.items_skipped, "rows_locked": chunk.rows_locked,
        "retryable_failures": chunk.transient_retries + chunk.failures,
        "chunks_committed": int(committed), "dead_lettered": chunk.dead_letters,
        "reconciled": chunk.reconciles, "duration_count": int(timed),
        "duration_sum_ms": chunk.duration_ms if timed else 0,
        "rows_count": int(committed), "rows_sum": changed if committed else 0,
    }
    figures |= {f"duration_le_{b}": int(timed and chunk.duration_ms <= b)
                for b in DURATION_BUCKETS_MS}
    figures |= {f"rows_le_{b}": int(committed and changed <= b) for b in ROWS_BUCKETS}
    return figures


def every_row() -> tuple[dict, dict, dict]:
    """The same figures counted here over every row (no purge has run)."""
    sums = defaultdict(lambda: defaultdict(int))
    states = defaultdict(lambda: defaultdict(int))
    running = defaultdict(int)
    for chunk in Chunk.objects.select_related("run"):
        for key, value in chunk_figures(chunk).items():
            sums[chunk.run.policy][key] += value
        states[chunk.run.policy][chunk.state] += 1
    for run in Run.objects.all():
        sums[run.policy][f"runs_{run.trigger}"] += 1
        sums[run.policy]["candidates_found"] += run.candidates
        sums[run.policy]["messages_sent"] += run.messages_sent
        running[run.policy] += run.state == Run.State.RUNNING
    for values in sums.values():
        values["rows_changed"] = values["rows_deleted"] + values["rows_updated"]
    return ({p: {k: v for k, v in values.items() if v} for p, values in sums.items()},
            {p: dict(values) for p, values in states.items()},
            {p: n for p, n in running.items() if n})


@pytest.fixture
def ledger(account, chunk_size, dead_letter):
    """A completed run of four chunks with a duplicate delivery, and a run with a dead
    letter, as the worker leaves them."""
    LeaseFactory.create_batch(7, account=account, expired=True)
    chunk_size("expire-leases", 2)
    run = dispatch_in_process("expire-leases").run
    apply_chunk(run.chunks.order_by("chunk_id").first().message)  # a duplicate: a no-op
    assert Run.objects.get(pk=run.pk).state == Run.State.COMPLETED
    assert run.chunks.count() >= 4
    return run


def test_the_totals_are_a_count_of_every_row(ledger):
    assert reported() == every_row()
    sums, states, running = reported()
    assert sums["expire-leases"]["noop_deliveries"] >= 1
    assert states["expire-leases"]["dead_lettered"] == 1 and running == {}


def test_replays_requeues_discards_and_cancels_keep_the_totals_a_count_of_every_row(
        ledger, dead_letter, account):
    replay(ledger.id)  # every chunk re-sent to its queue
    for chunk in ledger.chunks.all():
        apply_chunk(chunk.message)
    assert reported() == every_row()

    operations.requeue([dead_letter.pk], resend=False)
    apply_chunk(Chunk.objects.get(pk=dead_letter.pk).message)
    assert reported() == every_row()

    LeaseFactory.create_batch(3, account=account, expired=True)
    operations.discard([Chunk.objects.get(pk=dead_letter.pk).pk], "a test")  # done: a no-op
    queued = dispatch("expire-leases").run
    operations.cancel([queued.pk])
    assert reported() == every_row()
    _, states, running = reported()
    assert states["expire-leases"]["cancelled"] >= 1
    assert "expire-leases" not in running


def test_a_purge_keeps_the_counters_and_takes_the_gauges_of_what_it_deleted(ledger):
    before, states, _ = reported()
    old = timezone.now() - timedelta(days=60)
    Chunk.objects.filter(run__policy="expire-leases").update(planned_at=old)
    Run.objects.filter(policy="expire-leases").update(created_at=old, finished_at=old,
                                                      state=Run.State.COMPLETED)
    assert states["expire-leases"]

    dispatch_in_process(PURGE_CHUNKS)
    dispatch_in_process(PURGE_RUNS)

    assert not Chunk.objects.filter(run__policy="expire-leases").exists()
    assert not Run.objects.filter(policy="expire-leases").exists()
    after, states, running = reported()
    assert after["expire-leases"] == before["expire-leases"]
    assert "expire-leases" not in states and "expire-leases" not in running


def test_a_hand_edit_never_makes_a_counter_go_down(ledger):
    before, _, _ = reported()
    chunk = ledger.chunks.filter(rows_deleted__gt=0).first()
    Chunk.objects.filter(pk=chunk.pk).update(rows_deleted=0, deliveries=0)
    after = reported()[0]["expire-leases"]
    assert (after["rows_deleted"], after["deliveries"]) == (
        before["expire-leases"]["rows_deleted"], before["expire-leases"]["deliveries"])
    # Its rows now fall in lower buckets of the histogram: those count one more.
    assert all(after.get(key, 0) >= value for key, value in before["expire-leases"].items())

    Chunk.objects.filter(pk=chunk.pk).update(rows_deleted=5)  # up again: that much is new
    assert reported()[0]["expire-leases"]["rows_deleted"] == (
        before["expire-leases"]["rows_deleted"] + 5)


def test_the_sql_counts_into_the_buckets_the_metrics_report():
    arrays = re.findall(r"unnest\(ARRAY\[([\d,\s]+)\]\)", TOTALS_SQL.read_text())
    assert [tuple(int(n) for n in found.split(",")) for found in arrays] == [
        DURATION_BUCKETS_MS, ROWS_BUCKETS]


@pytest.mark.django_db(transaction=True)
def test_a_change_is_counted_when_it_commits_and_never_if_it_rolls_back(account):
    LeaseFactory.create_batch(2, account=account, expired=True)
    run = dispatch("expire-leases").run
    chunk = run.chunks.get()

    def deliveries_seen_elsewhere() -> int:
        with psycopg.connect(database_url()) as other:
            row = other.execute("SELECT figures FROM cleanup_total WHERE family = 'policy' "
                                "AND subject = 'expire-leases'").fetchone()
        return row[0].get("deliveries", 0)

    with transaction.atomic():
        Chunk.objects.filter(pk=chunk.pk).update(deliveries=7)
        assert deliveries_seen_elsewhere() == 0  # not before the commit
    assert deliveries_seen_elsewhere() == 7

    with pytest.raises(RuntimeError), transaction.atomic():
        Chunk.objects.filter(pk=chunk.pk).update(deliveries=9)
        raise RuntimeError("rolled back")
    assert deliveries_seen_elsewhere() == 7


@pytest.mark.django_db(transaction=True)
def test_the_migration_counts_what_the_scrape_summed_before_it(account):
    """An earlier release's figures: purged and folded sums in LedgerTotal, chunks not
    folded and every run counted live, the outbox's totals in EventTotal."""
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes()
    before = [("cleanup", "0021_run_in_process_gone")]
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    OldRun, OldChunk = old.get_model("cleanup", "Run"), old.get_model("cleanup", "Chunk")
    run = OldRun.objects.create(policy="expire-leases", dispatch_key="k", cutoff=timezone.now(),
                                scheme="items", trigger="schedule", candidates=9,
                                messages_sent=3, state="completed")
    OldChunk.objects.create(run=run, chunk_id=1, state="acknowledged", message={},
                            deliveries=2, rows_deleted=4, committed_at=timezone.now(),
                            duration_ms=7, folded=False)
    OldChunk.objects.create(run=run, chunk_id=2, state="acknowledged", message={},
                            deliveries=1, rows_deleted=5, committed_at=timezone.now(),
                            duration_ms=7, folded=True)  # its figures are in LedgerTotal
    ledger_total = old.get_model("cleanup", "LedgerTotal")
    for key, value in {"rows_deleted": 5 + 100, "deliveries": 1, "state_acknowledged": 1,
                       "runs_command": 2}.items():
        ledger_total.objects.create(policy="expire-leases", key=key, value=value)
    old.get_model("cleanup", "EventTotal").objects.create(name="seat.freed", state="delivered",
                                                          value=6)
    try:
        executor = MigrationExecutor(connection)
        executor.migrate(latest)
        figures = Total.objects.get(family="policy", subject="expire-leases").figures
        assert (figures["rows_deleted"], figures["deliveries"]) == (109, 3)
        assert (figures["state_acknowledged"], figures["runs_schedule"],
                figures["runs_command"], figures["candidates_found"]) == (2, 1, 2, 9)
        assert figures["duration_le_10"] == 1 and "running" not in figures
        assert Total.objects.get(family="event", subject="seat.freed").figures == {
            "delivered": 6}
    finally:
        Chunk.objects.all().delete()
        Run.objects.all().delete()
        Total.objects.all().delete()


@pytest.mark.parametrize("edited", [
    {"deliveries": "many", "rows_deleted": 1e30, "state_enqueued": None},
    [1, 2, 3],
    "figures",
])
def test_totals_edited_by_hand_never_stop_a_commit_nor_a_scrape(account, edited, client):
    LeaseFactory.create_batch(2, account=account, expired=True)
    run = dispatch("expire-leases").run
    Total.objects.filter(family="policy", subject="expire-leases").update(figures=edited)

    assert apply_chunk(run.chunks.get().message) == "deleted"

    figures = Total.objects.get(family="policy", subject="expire-leases").figures
    assert figures["rows_deleted"] == 2  # counted from 0 again, the rest kept
    assert client.get("/metrics").status_code == 200
