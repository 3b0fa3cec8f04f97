"""The worker's outcomes: one conditional DELETE per chunk, committed with its ledger row."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from cleanup import faults
from cleanup.engine import cpu_wait, sizing, transitions
from cleanup.engine.dispatch import dispatch
from cleanup.engine.worker import Outcome, apply_chunk
from cleanup.models import Chunk, OrphanMessage, Run
from cleanup.policies import get_policy
from tests.conftest import chunks_of
from tests.engine_app.factories import LeaseFactory, LeaseLogFactory
from tests.engine_app.models import Lease, LeaseLog
from tests.engine_app.services import keep_lease, renew_lease

pytestmark = pytest.mark.django_db


def only_chunk(run: Run) -> Chunk:
    (chunk,) = chunks_of(run)
    return chunk


def test_delivery_deletes_expired_leases_and_commits_the_chunk(expired_leases, account):
    active = LeaseFactory(account=account)
    run = dispatch("expire-leases").run
    chunk = only_chunk(run)

    assert apply_chunk(chunk.message) == Outcome.DELETED

    chunk.refresh_from_db()
    run.refresh_from_db()
    assert chunk.state == Chunk.State.COMMITTED
    assert chunk.rows_deleted == 5
    assert (chunk.deliveries, chunk.deliveries_completed, chunk.noop_deliveries) == (1, 1, 0)
    assert run.state == Run.State.COMPLETED
    assert list(Lease.objects.all()) == [active]


@pytest.mark.skipif(cpu_wait.waited() is None or not hasattr(os, "sched_setaffinity"),
                    reason="the kernel reports no CPU wait, or no CPU can be pinned")
def test_a_chunk_records_how_long_its_worker_waited_for_a_cpu(expired_leases):
    chunk = only_chunk(dispatch("expire-leases").run)
    # The worker's thread and a spinning process share one CPU while the thread computes
    # for 0.2 s inside the chunk's transaction: it waits for the CPU about as long.
    allowed = os.sched_getaffinity(0)
    cpu = min(allowed)
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                               preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))

    def compute() -> None:
        deadline = time.thread_time() + 0.2
        while time.thread_time() < deadline:
            pass

    os.sched_setaffinity(0, {cpu})
    try:
        time.sleep(0.1)  # the spinner is running
        with faults.injected(faults.BEFORE_CHUNK_LOCK, compute):
            apply_chunk(chunk.message)
    finally:
        os.sched_setaffinity(0, allowed)
        spinner.kill()
        spinner.wait()
    chunk.refresh_from_db()
    assert chunk.duration_ms >= 200
    assert 100 <= chunk.cpu_wait_ms < chunk.duration_ms, (chunk.cpu_wait_ms, chunk.duration_ms)


def test_same_chunk_delivered_twice_second_is_noop(expired_leases):
    chunk = only_chunk(dispatch("expire-leases").run)
    apply_chunk(chunk.message)

    assert apply_chunk(chunk.message) == Outcome.NOOP

    chunk.refresh_from_db()
    assert chunk.rows_deleted == 5
    assert (chunk.deliveries, chunk.deliveries_completed, chunk.noop_deliveries) == (2, 2, 1)


def test_hold_renewed_or_confirmed_after_planning_survives(expired_leases):
    renewed, kept, *others = expired_leases
    chunk = only_chunk(dispatch("expire-leases").run)
    renew_lease(renewed.pk)
    keep_lease(kept.pk)

    apply_chunk(chunk.message)

    chunk.refresh_from_db()
    assert set(Lease.objects.values_list("pk", flat=True)) == {renewed.pk, kept.pk}
    assert (chunk.rows_deleted, chunk.items_skipped) == (3, 2)


def test_failure_just_before_commit_changes_nothing_and_retry_succeeds(expired_leases):
    chunk = only_chunk(dispatch("expire-leases").run)
    seen = []

    def connection_lost_before_commit():
        # The DELETE and the ledger write ran in this transaction, not yet committed.
        seen.append(Lease.objects.count())
        if len(seen) == 1:
            raise OperationalError("injected: connection lost before commit")

    with faults.injected(faults.BEFORE_COMMIT, connection_lost_before_commit):
        assert apply_chunk(chunk.message) == Outcome.DELETED

    chunk.refresh_from_db()
    assert seen == [0, 0]  # the first attempt rolled back: the retry deleted again
    assert (chunk.rows_deleted, chunk.transient_retries, chunk.deliveries_completed) == (5, 1, 1)
    assert Lease.objects.count() == 0


def test_transient_error_outlasting_retries_is_raised_for_redelivery(expired_leases, settings):
    settings.CLEANUP_TRANSIENT_RETRIES = 2
    chunk = only_chunk(dispatch("expire-leases").run)

    def always_lost():
        raise OperationalError("injected: connection lost before commit")

    with faults.injected(faults.BEFORE_COMMIT, always_lost), pytest.raises(OperationalError):
        apply_chunk(chunk.message)

    chunk.refresh_from_db()
    assert Lease.objects.count() == 5
    assert (chunk.state, chunk.rows_deleted, chunk.failures) == (Chunk.State.RETRYING, 0, 1)
    assert chunk.failure_class == Chunk.FailureClass.TRANSIENT
    assert "connection lost" in chunk.last_error

    assert apply_chunk(chunk.message) == Outcome.DELETED  # the broker's redelivery
    assert Lease.objects.count() == 0


def test_deterministic_error_is_dead_lettered_at_once(expired_leases):
    chunk = only_chunk(dispatch("expire-leases").run)

    def bug():
        raise TypeError("injected programming error")

    with faults.injected(faults.BEFORE_COMMIT, bug):
        assert apply_chunk(chunk.message) == Outcome.DEAD_LETTERED

    chunk.refresh_from_db()
    assert chunk.state == Chunk.State.DEAD_LETTERED
    assert chunk.failure_class == Chunk.FailureClass.ERROR
    assert "injected programming error" in chunk.last_error
    assert Lease.objects.count() == 5


def test_redelivery_after_commit_without_ack_is_noop(expired_leases):
    chunk = only_chunk(dispatch("expire-leases").run)
    apply_chunk(chunk.message)  # committed; the worker "dies" before django-q2 acks
    LeaseFactory(account=expired_leases[0].account, expired=True)  # a newer expired lease

    assert apply_chunk(chunk.message) == Outcome.NOOP

    chunk.refresh_from_db()
    assert chunk.state == Chunk.State.COMMITTED
    assert chunk.rows_deleted == 5
    assert Lease.objects.count() == 1


def test_cutoff_stays_frozen_when_the_clock_moves_on_during_retries(
    account, monkeypatch
):
    cutoff = timezone.now() - timedelta(hours=2)
    old = LeaseFactory(account=account, expires_at=cutoff - timedelta(minutes=5))
    # Expired by now, but not at the frozen cutoff: a later delivery must leave it.
    later = LeaseFactory(account=account, expires_at=cutoff + timedelta(minutes=30))
    chunk = only_chunk(dispatch("expire-leases", scheme="range", cutoff=cutoff).run)
    real_record, real_now = transitions.to_committed, timezone.now
    attempts = []

    def fail_once_then_move_the_clock(*args, **kwargs):
        real_record(*args, **kwargs)
        attempts.append(1)
        if len(attempts) == 1:
            monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(days=1))
            raise OperationalError("injected: connection lost before commit")

    monkeypatch.setattr(transitions, "to_committed", fail_once_then_move_the_clock)

    assert apply_chunk(chunk.message) == Outcome.DELETED
    assert len(attempts) == 2
    assert list(Lease.objects.all()) == [later]
    assert not Lease.objects.filter(pk=old.pk).exists()


def test_message_whose_items_differ_from_the_ledger_is_refused(expired_leases):
    chunk = only_chunk(dispatch("expire-leases").run)
    message = {**chunk.message, "items": chunk.message["items"][:1]}

    assert apply_chunk(message) == Outcome.DEAD_LETTERED

    chunk.refresh_from_db()
    assert "differ from the chunk in the ledger" in chunk.last_error
    assert Lease.objects.count() == 5


def test_captured_delete_carries_the_whole_predicate_in_its_own_where(expired_leases):
    chunk = only_chunk(dispatch("expire-leases").run)

    with CaptureQueriesContext(connection) as queries:
        apply_chunk(chunk.message)

    statements = [q["sql"] for q in queries.captured_queries]
    deletes = [s for s in statements if s.lstrip().upper().startswith("DELETE")]
    assert len(deletes) == 1, statements
    (delete,) = deletes
    table = Lease._meta.db_table
    assert delete.startswith(f'DELETE FROM "{table}" WHERE')
    where = delete.split(" WHERE ", 1)[1]
    assert f'"{table}"."state" = \'active\'' in where
    assert f'"{table}"."expires_at" <=' in where
    # Each (id, observed expiry) pair is matched against the row's own columns.
    assert f'("{table}"."id", "{table}"."expires_at") IN (SELECT * FROM unnest(' in where
    assert f'FROM "{table}"' not in where  # no subquery over the table itself
    # Never read the leases first and delete them by pk.
    assert not any(
        s.upper().startswith("SELECT") and f'FROM "{table}"' in s for s in statements
    )


def test_whole_table_range_delete_carries_bounds_and_predicate_without_a_tenant(
        expired_leases):
    (chunk,) = chunks_of(dispatch("expire-leases", scheme="range").run)

    with CaptureQueriesContext(connection) as queries:
        assert apply_chunk(chunk.message) == Outcome.DELETED

    (delete,) = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("DELETE")]
    where = delete.split(" WHERE ", 1)[1]
    assert "SELECT" not in where and '"account_id"' not in where
    for column in ('"state" = \'active\'', '"expires_at" <=', '"id" >=', '"id" <'):
        assert column in where


def test_a_range_message_missing_its_partition_for_a_partitioned_policy_is_refused(db):
    LeaseLogFactory(stale=True)
    chunk = dispatch("purge-lease-logs").run.chunks.get()
    forged = {k: v for k, v in chunk.message.items() if k != "partition"}

    assert apply_chunk(forged) == Outcome.DEAD_LETTERED
    chunk.refresh_from_db()
    assert "differ from the chunk in the ledger" in chunk.last_error


def test_range_delete_carries_tenant_bounds_and_predicate(db):
    stale = LeaseLogFactory.create_batch(3, stale=True)
    run = dispatch("purge-lease-logs").run

    with CaptureQueriesContext(connection) as queries:
        for chunk in chunks_of(run):
            apply_chunk(chunk.message)

    deletes = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("DELETE")]
    assert len(deletes) == len(stale)  # three accounts, one range each
    for delete in deletes:
        where = delete.split(" WHERE ", 1)[1]
        assert "SELECT" not in where
        for column in ('"recorded_at" <=', '"account_id" =', '"id" >=', '"id" <'):
            assert column in where


def test_before_delete_sees_exactly_the_rows_the_delete_removes(expired_leases):
    renewed, kept, *others = expired_leases  # inside the chunk's id range, all of them
    (chunk,) = chunks_of(dispatch("expire-leases-range").run)
    renew_lease(renewed.pk)
    keep_lease(kept.pk)

    assert apply_chunk(chunk.message) == Outcome.DELETED

    assert sorted(LeaseLog.objects.values_list("lease_id", flat=True)) == sorted(
        lease.pk for lease in others)
    assert set(Lease.objects.values_list("pk", flat=True)) == {renewed.pk, kept.pk}
    assert apply_chunk(chunk.message) == Outcome.NOOP  # a redelivery logs nothing more
    assert LeaseLog.objects.count() == 3


def test_a_version_3_range_message_naming_its_partition_tenant_id_is_still_read(db):
    LeaseLogFactory.create_batch(2, stale=True)
    run = dispatch("purge-lease-logs").run
    chunk = chunks_of(run)[0]
    assert chunk.message["version"] == 4 and "partition" in chunk.message
    v3 = {k: v for k, v in chunk.message.items() if k != "partition"}
    v3.update(version=3, tenant_id=chunk.message["partition"])

    assert apply_chunk(v3) == Outcome.DELETED
    chunk.refresh_from_db()
    assert chunk.rows_deleted == 1


@pytest.mark.parametrize(
    "raw, reason",
    [
        ({"version": 99, "run_id": None, "chunk_id": 1}, "unknown message version 99"),
        ("not json at all", "not a JSON object"),
        ({"version": 4}, "run_id is missing"),
    ],
)
def test_unidentifiable_bad_message_is_kept_as_orphan(db, raw, reason):
    assert apply_chunk(raw) == Outcome.DEAD_LETTERED
    (orphan,) = OrphanMessage.objects.all()
    assert reason in orphan.error
    assert orphan.raw


def test_unknown_version_is_dead_lettered_with_its_run_identified(expired_leases):
    chunk = only_chunk(dispatch("expire-leases").run)
    message = {**chunk.message, "version": 99}

    assert apply_chunk(message) == Outcome.DEAD_LETTERED

    chunk.refresh_from_db()
    assert chunk.state == Chunk.State.DEAD_LETTERED
    assert chunk.failure_class == Chunk.FailureClass.MALFORMED
    assert "unknown message version 99" in chunk.last_error
    assert chunk.run.state == Run.State.COMPLETED_WITH_DEAD_LETTERS
    assert Lease.objects.count() == 5


def test_a_refused_delivery_keeps_the_message_it_carried_when_it_differs(expired_leases):
    chunk = only_chunk(dispatch("expire-leases").run)

    apply_chunk({**chunk.message, "version": 99})

    chunk.refresh_from_db()
    assert json.loads(chunk.received_message)["version"] == 99
    assert chunk.message["version"] == 4  # the ledger's copy is untouched


def test_malformed_message_is_dead_lettered_with_its_run_identified(expired_leases):
    chunk = only_chunk(dispatch("expire-leases").run)
    message = {**chunk.message, "items": [["x"]]}

    assert apply_chunk(message) == Outcome.DEAD_LETTERED

    chunk.refresh_from_db()
    assert chunk.state == Chunk.State.DEAD_LETTERED
    assert "pair" in chunk.last_error
    assert OrphanMessage.objects.count() == 0


@pytest.mark.parametrize("observed", ["2026-13-45T00:00:00.000000+00:00", "soon", 12])
def test_an_observed_value_that_is_no_instant_is_malformed(expired_leases, observed):
    chunk = only_chunk(dispatch("expire-leases").run)
    pk = chunk.message["items"][0][0]
    message = {**chunk.message, "items": [[pk, observed]]}

    assert apply_chunk(message) == Outcome.DEAD_LETTERED

    chunk.refresh_from_db()
    assert chunk.failure_class == Chunk.FailureClass.MALFORMED
    assert "observed value" in chunk.last_error
    assert Lease.objects.count() == 5


def test_previous_message_version_is_still_understood(expired_leases):
    chunk = only_chunk(dispatch("expire-leases").run)
    assert chunk.message["version"] == 4

    assert apply_chunk({**chunk.message, "version": 3}) == Outcome.DELETED
    assert Lease.objects.count() == 0


def test_message_for_a_chunk_that_does_not_exist_is_an_orphan(expired_leases):
    chunk = only_chunk(dispatch("expire-leases").run)
    message = {**chunk.message, "chunk_id": 999}

    assert apply_chunk(message) == Outcome.DEAD_LETTERED
    assert "has no chunk 999" in OrphanMessage.objects.get().error
    assert Lease.objects.count() == 5


def test_message_whose_cutoff_differs_from_its_run_is_refused(expired_leases):
    chunk = only_chunk(dispatch("expire-leases").run)
    message = {**chunk.message, "cutoff": timezone.now().isoformat()}

    assert apply_chunk(message) == Outcome.DEAD_LETTERED
    assert Lease.objects.count() == 5


def test_poison_chunk_is_dead_lettered_after_the_limit(expired_leases, settings):
    settings.CLEANUP_MAX_UNFINISHED_DELIVERIES = 3
    chunk = only_chunk(dispatch("expire-leases").run)
    # Three deliveries that started and never completed (their worker was killed);
    # tests/engine/test_processes.py kills real processes, this pins the arithmetic.
    Chunk.objects.filter(pk=chunk.pk).update(deliveries=3)

    assert apply_chunk(chunk.message) == Outcome.DEAD_LETTERED

    chunk.refresh_from_db()
    assert chunk.state == Chunk.State.DEAD_LETTERED
    assert chunk.failure_class == Chunk.FailureClass.POISON
    assert "3 deliveries started without completing" in chunk.verdict
    assert Lease.objects.count() == 5


def test_chunk_delivered_three_times_healthily_is_not_dead_lettered(expired_leases, settings):
    settings.CLEANUP_MAX_UNFINISHED_DELIVERIES = 3
    chunk = only_chunk(dispatch("expire-leases").run)

    outcomes = [apply_chunk(chunk.message) for _ in range(4)]

    chunk.refresh_from_db()
    assert outcomes == [Outcome.DELETED, Outcome.NOOP, Outcome.NOOP, Outcome.NOOP]
    assert chunk.state == Chunk.State.COMMITTED


def test_committed_chunk_is_never_dead_lettered(expired_leases, settings):
    settings.CLEANUP_MAX_UNFINISHED_DELIVERIES = 1
    chunk = only_chunk(dispatch("expire-leases").run)
    apply_chunk(chunk.message)
    Chunk.objects.filter(pk=chunk.pk).update(deliveries=10)

    assert apply_chunk(chunk.message) == Outcome.NOOP
    chunk.refresh_from_db()
    assert chunk.state == Chunk.State.COMMITTED


def test_requeued_dead_letter_gets_a_fresh_delivery_limit(expired_leases, settings):
    from cleanup.engine.replay import replay

    settings.CLEANUP_MAX_UNFINISHED_DELIVERIES = 2
    chunk = only_chunk(dispatch("expire-leases").run)
    Chunk.objects.filter(pk=chunk.pk).update(deliveries=2)
    apply_chunk(chunk.message)

    replay(chunk.run_id, chunk_ids=[chunk.chunk_id])

    assert apply_chunk(chunk.message) == Outcome.DELETED
    chunk.refresh_from_db()
    assert chunk.run.state == Run.State.COMPLETED
    assert chunk.dead_letters == 1  # counters only add


def test_idempotency_keys_are_logged_at_debug(expired_leases, caplog):
    chunk = only_chunk(dispatch("expire-leases").run)
    lease = expired_leases[0]

    with caplog.at_level("DEBUG", logger="cleanup.worker"):
        apply_chunk(chunk.message)

    events = [r.msg for r in caplog.records if isinstance(r.msg, dict)]
    keys = [e["idempotency_key"] for e in events if "idempotency_key" in e]
    assert f"lease:{lease.pk}:{lease.expires_at.isoformat()}" in keys
    assert len(keys) == 5
    (outcome,) = [e for e in events if e["event"] == "chunk outcome"]
    assert (outcome["run_id"], outcome["chunk_id"], outcome["outcome"]) == (
        str(chunk.run_id), chunk.chunk_id, "deleted")
    assert (outcome["rows_deleted"], outcome["policy"]) == (5, "expire-leases")



# What a chunk's end costs: a range chunk whose commit plans the next


def test_a_range_chunk_that_plans_the_next_costs_five_statements(account, settings):
    """Its DELETE and four calls of the ledger's functions (and, outside a test, the
    chunk transaction's BEGIN and COMMIT): 6 round trips besides the DELETE. Pinned so a
    change that adds a round trip to every chunk is seen: on a small machine each costs
    about 1 ms of the worker's time beside a 40 ms DELETE (docs/performance.md, The fixed
    cost of a chunk). The delivery's start, committed on its own; the chunk's
    transaction opened (bounds, name, lock, its run's state); its outcome recorded with
    the window's top-up opened (the planning lock, the policy's runs, its chunks in
    flight, whether a halt is open, the oldest run locked with its latest chunks' pace);
    and the next chunk, planned from the run's density, written with its queue row and
    the run's planning. No savepoint: nothing in between can fail the transaction."""
    settings.CLEANUP_CHUNK_BUDGET_MS = 40  # sizing reads the run's pace, as by default
    Lease.objects.bulk_create(LeaseFactory.build_batch(2_600, account=account, expired=True))
    run = dispatch("expire-leases", scheme="range").run
    first, *_ = chunks_of(run)
    assert run.chunk_size * len(chunks_of(run)) < 2_600  # more to plan after the window

    before = Run.objects.get(pk=run.pk)

    with CaptureQueriesContext(connection) as queries:
        assert apply_chunk(first.message) == Outcome.DELETED

    # In the test's transaction the chunk's own transaction is a savepoint.
    statements = [q["sql"] for q in queries.captured_queries]
    assert [sql.split()[0] for sql in statements] == [
        "SELECT", "SAVEPOINT", "SELECT", "DELETE", "SELECT", "SELECT", "RELEASE"], (
        "\n".join(sql[:100] for sql in statements))
    assert [re.search(r"cleanup_\w+_v1", sql).group() for sql in statements
            if sql.startswith("SELECT")] == [
        "cleanup_delivery_start_v1", "cleanup_chunk_begin_v1", "cleanup_top_up_open_v1",
        "cleanup_run_planned_v1"]
    assert len(chunks_of(run)) == 5  # the chunk's end planned the next
    assert chunks_of(run)[-1].rows_estimated  # ... from the density, not counted
    # ... at the size the chunk's pace gives, read as on its own.
    after = Run.objects.get(pk=run.pk)
    assert (after.next_chunk_size, after.max_span) == sizing.next_size(before, get_policy(
        "expire-leases"))
    assert after.state == Run.State.RUNNING


@pytest.mark.parametrize("content, reading", [
    ("481172 1563123 1\n", 0.001563123),
    ("0 0 0\n", None),  # a kernel keeping no scheduler statistics
    ("", None),
    ("not numbers\n", None),
])
def test_the_cpu_wait_is_read_from_the_threads_schedstat(tmp_path, monkeypatch, content,
                                                         reading):
    stat = tmp_path / "schedstat"
    stat.write_text(content)
    monkeypatch.setattr(cpu_wait, "SCHEDSTAT", str(stat))
    assert cpu_wait.waited() == (pytest.approx(reading) if reading else None)


def test_no_cpu_wait_reading_where_the_kernel_gives_none(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_wait, "SCHEDSTAT", str(tmp_path / "absent"))
    assert cpu_wait.waited() is None
    assert cpu_wait.since(1.0) is None
    monkeypatch.undo()
    assert cpu_wait.since(None) is None


def test_a_commit_keeps_no_cpu_wait_it_was_not_given_and_never_more_than_its_time(
        expired_leases, chunk_size):
    chunk_size("expire-leases", 3)
    first, second = chunks_of(dispatch("expire-leases").run)
    transitions.to_committed(first, deleted=0, retries=0, elapsed=0.05)
    transitions.to_committed(second, deleted=0, retries=0, elapsed=0.05, cpu_wait=0.5)
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.duration_ms, first.cpu_wait_ms) == (50, None)
    assert (second.duration_ms, second.cpu_wait_ms) == (50, 50)
