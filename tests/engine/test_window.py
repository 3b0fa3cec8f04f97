"""Runs that stream: the first window at dispatch, each next chunk planned by the
transaction that ends one, never more than W of a policy in flight, the frontier
advancing whatever one chunk's fate, sizes following the run's own pace."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone
from django_q.conf import Conf
from django_q.models import OrmQ

from cleanup.engine import operations, planning, window
from cleanup.engine.dispatch import dispatch, dispatch_in_process
from cleanup.engine.reconcile import reconcile
from cleanup.engine.sizing import STEP
from cleanup.engine.worker import Outcome, apply_chunk
from cleanup.models import Chunk, Run
from tests.conftest import SCRATCH_REDIS_URL, chunks_of
from tests.engine_app.factories import LeaseFactory
from tests.engine_app.models import Lease

pytestmark = pytest.mark.django_db


def unfinished(policy: str = "expire-leases") -> list[Chunk]:
    return list(Chunk.objects.filter(run__policy=policy, state__in=Chunk.UNFINISHED)
                .order_by("run__created_at", "chunk_id"))


def drain(policy: str = "expire-leases") -> int:
    """Deliver the policy's unfinished chunks as a worker would, until none is left;
    return the most that were ever in flight at once."""
    peak = 0
    while chunks := unfinished(policy):
        peak = max(peak, len(chunks))
        apply_chunk(chunks[0].message)
    return peak


@pytest.fixture
def small_window(settings, chunk_size):
    """Chunks of one lease, two in flight."""
    settings.CLEANUP_WINDOW = 2
    chunk_size("expire-leases", 1)


def test_dispatch_sends_the_first_window_and_each_commit_plans_the_next(account,
                                                                       small_window):
    LeaseFactory.create_batch(5, account=account, expired=True)

    run = dispatch("expire-leases", scheme="range").run

    assert (run.chunks_planned, run.planned_all, run.state) == (2, False, Run.State.RUNNING)
    assert OrmQ.objects.count() == 2  # the messages committed with the run
    first = chunks_of(run)[0]
    assert apply_chunk(first.message) == Outcome.DELETED
    run.refresh_from_db()
    # The commit planned chunk 3 and its message in the same transaction.
    assert run.chunks_planned == 3
    assert Chunk.objects.get(run=run, chunk_id=3).state == Chunk.State.ENQUEUED
    assert OrmQ.objects.count() == 3

    assert drain() == 2
    run.refresh_from_db()
    assert (run.chunks_planned, run.candidates, run.planned_all) == (5, 5, True)
    assert run.state == Run.State.COMPLETED and run.frontier is None
    assert Lease.objects.count() == 0
    ranges = sorted((c.message["start_id"], c.message["end_id"]) for c in chunks_of(run))
    assert all(left[1] <= right[0] for left, right in zip(ranges, ranges[1:], strict=False))


def test_a_small_backlog_is_one_chunk(expired_leases):
    run = dispatch("expire-leases").run

    assert (run.chunks_planned, run.planned_all) == (1, True)
    assert apply_chunk(chunks_of(run)[0].message) == Outcome.DELETED
    run.refresh_from_db()
    assert run.state == Run.State.COMPLETED


def test_a_dead_lettered_chunk_does_not_stop_the_frontier(account, small_window):
    leases = LeaseFactory.create_batch(4, account=account, expired=True)
    run = dispatch("expire-leases").run
    first = chunks_of(run)[0]

    # A delivery whose cutoff contradicts its run is dead-lettered at once.
    forged = {**first.message, "cutoff": "2000-01-01T00:00:00+00:00"}
    assert apply_chunk(forged) == Outcome.DEAD_LETTERED

    assert drain() <= 2
    run.refresh_from_db()
    assert run.planned_all and run.chunks_planned == 4
    assert run.state == Run.State.COMPLETED_WITH_DEAD_LETTERS
    assert list(Lease.objects.values_list("pk", flat=True)) == [leases[0].pk]

    operations.discard([first.pk], "forged in a test")
    run.refresh_from_db()
    assert run.state == Run.State.COMPLETED


def test_a_second_run_of_the_policy_waits_for_room_in_the_window(account, settings,
                                                                 chunk_size):
    settings.CLEANUP_WINDOW = 1
    chunk_size("expire-leases", 2)
    now = timezone.now()
    LeaseFactory.create_batch(3, account=account, expires_at=now - timedelta(hours=2))
    late = LeaseFactory(account=account, expires_at=now - timedelta(minutes=10))
    first = dispatch("expire-leases", key="first", cutoff=now - timedelta(hours=1)).run
    second = dispatch("expire-leases", key="second").run

    assert (first.chunks_planned, second.chunks_planned) == (1, 0)
    assert second.state == Run.State.RUNNING  # waiting, not completed

    assert drain() == 1
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.state == second.state == Run.State.COMPLETED
    # The second planned its chunk once the first's last one had finished.
    assert (first.candidates, second.candidates) == (3, 1)
    (chunk,) = chunks_of(second)
    assert chunk.planned_at >= max(c.committed_at for c in chunks_of(first))
    assert not Lease.objects.filter(pk=late.pk).exists()


def test_a_cancelled_run_plans_nothing_more_and_its_room_goes_to_the_next(
        account, settings, chunk_size, django_capture_on_commit_callbacks):
    settings.CLEANUP_WINDOW = 1
    chunk_size("expire-leases", 1)
    LeaseFactory.create_batch(3, account=account, expired=True)
    first = dispatch("expire-leases", key="first").run
    second = dispatch("expire-leases", key="second").run

    with django_capture_on_commit_callbacks(execute=True):
        operations.cancel([first.pk])

    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.state, first.planned_all, first.chunks_planned) == (
        Run.State.CANCELLED, True, 1)
    assert second.chunks_planned == 1
    drain()
    assert Chunk.objects.filter(run=first).count() == 1
    assert Lease.objects.count() == 0  # all by the second run


def test_a_sync_dispatch_applies_every_chunk_it_plans(account, small_window):
    LeaseFactory.create_batch(7, account=account, expired=True)

    run = dispatch_in_process("expire-leases").run

    assert (run.state, run.chunks_planned) == (Run.State.COMPLETED, 7)
    assert OrmQ.objects.count() == 0  # each message went as its chunk committed here
    assert Lease.objects.count() == 0


@pytest.mark.parametrize("scheme", ["items", "range"])
def test_chunk_sizes_follow_the_runs_pace_by_at_most_a_step(account, settings, chunk_size,
                                                             scheme):
    settings.CLEANUP_CHUNK_BUDGET_MS = 40
    settings.CLEANUP_MIN_ROWS_PER_CHUNK = 1
    settings.CLEANUP_WINDOW = 1
    chunk_size("expire-leases", 2)
    LeaseFactory.create_batch(300, account=account, expired=True)

    run = dispatch("expire-leases", scheme=scheme).run
    drain()

    sizes = [c.planned_rows for c in chunks_of(run)]
    run.refresh_from_db()
    assert sum(sizes) == 300 and run.state == Run.State.COMPLETED
    assert sizes[0] == 2
    for previous, size in zip(sizes, sizes[1:-1], strict=False):  # the last is what was left
        assert previous / STEP <= size <= previous * STEP
    # A first run on an empty ledger grows within a handful of chunks.
    assert max(sizes[:6]) >= 16


def test_planning_that_fails_keeps_the_outcome_and_the_reconciler_plans_on(
        account, small_window, monkeypatch):
    LeaseFactory.create_batch(3, account=account, expired=True)
    run = dispatch("expire-leases").run

    def broken(*args, **kwargs):
        raise RuntimeError("planner down")

    monkeypatch.setattr(planning, "next_chunk", broken)
    assert apply_chunk(chunks_of(run)[0].message) == Outcome.DELETED
    run.refresh_from_db()
    assert (run.chunks_planned, run.state) == (2, Run.State.RUNNING)
    assert Lease.objects.count() == 2

    monkeypatch.undo()
    OrmQ.objects.all().delete()  # the reconciler waits for a drained queue to re-send
    assert reconcile().planned == 1
    drain()
    run.refresh_from_db()
    assert run.state == Run.State.COMPLETED and Lease.objects.count() == 0


def test_the_window_is_per_policy_and_a_policy_may_set_its_own(account, settings, chunk_size):
    settings.CLEANUP_WINDOW = 3
    policy = chunk_size("expire-leases", 1)
    assert window.size(policy) == 3
    from dataclasses import replace

    from cleanup.policies import register_policy
    register_policy(replace(policy, window=1))
    LeaseFactory.create_batch(4, account=account, expired=True)

    run = dispatch("expire-leases").run

    assert (run.window, run.chunks_planned) == (1, 1)


@pytest.mark.django_db(transaction=True)
def test_concurrent_commits_never_plan_a_row_twice_nor_overfill_the_window(account, settings,
                                                                           chunk_size):
    settings.CLEANUP_WINDOW = 3
    chunk_size("expire-leases", 2)
    LeaseFactory.create_batch(60, account=account, expired=True)
    run = dispatch("expire-leases").run
    peaks, errors = [], []

    def worker():
        try:
            while chunks := list(Chunk.objects.filter(run=run, state__in=Chunk.UNFINISHED)
                                 .order_by("?")):
                peaks.append(len(chunks))
                apply_chunk(chunks[0].message)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert errors == []
    run.refresh_from_db()
    assert run.state == Run.State.COMPLETED and Lease.objects.count() == 0
    planned = [pk for chunk in chunks_of(run) for pk, _ in chunk.message["items"]]
    assert len(planned) == len(set(planned)) == 60
    assert max(peaks) <= 3


@pytest.mark.django_db(transaction=True)  # the next message goes out on commit
def test_with_redis_the_next_chunk_is_sent_after_its_planners_commit(account, settings,
                                                                     chunk_size, monkeypatch):
    import redis

    url = SCRATCH_REDIS_URL
    client = redis.from_url(url)
    client.flushdb()
    monkeypatch.setattr(Conf, "ORM", None)
    monkeypatch.setattr(Conf, "REDIS", url)
    settings.CLEANUP_WINDOW = 1
    chunk_size("expire-leases", 1)
    LeaseFactory.create_batch(2, account=account, expired=True)
    queue = f"django_q:{Conf.CLUSTER_NAME}:q"
    try:
        run = dispatch("expire-leases").run
        assert client.llen(queue) == 1

        apply_chunk(chunks_of(run)[0].message)

        second = Chunk.objects.get(run=run, chunk_id=2)
        assert second.state == Chunk.State.ENQUEUED and client.llen(queue) == 2
        apply_chunk(second.message)
        run.refresh_from_db()
        assert run.state == Run.State.COMPLETED and Lease.objects.count() == 0
    finally:
        client.flushdb()


def test_status_shows_the_position_in_the_span_and_the_rows_to_go(account, small_window):
    from cleanup.observability.status import run_summary

    LeaseFactory.create_batch(8, account=account, expired=True)
    run = dispatch("expire-leases", scheme="range").run
    apply_chunk(chunks_of(run)[0].message)
    run.refresh_from_db()

    during = run_summary(run)
    assert during["planned_all"] is False and during["chunks_planned"] == 3
    assert 0 < during["position"] < 1
    assert during["estimated_remaining_rows"] > 0
    assert during["frontier"] == {"next_id": chunks_of(run)[-1].message["end_id"]}

    drain()
    run.refresh_from_db()
    after = run_summary(run)
    assert (after["planned_all"], after["position"], after["estimated_remaining_rows"]) == (
        True, 1.0, 0)
    assert after["chunks_planned"] == 8


def test_a_run_whose_planning_fails_is_skipped_and_keeps_the_error(account, settings,
                                                                   chunk_size, monkeypatch):
    settings.CLEANUP_WINDOW = 2
    chunk_size("expire-leases", 1)
    LeaseFactory.create_batch(4, account=account, expired=True)
    broken = dispatch("expire-leases", key="broken").run
    healthy = dispatch("expire-leases", key="healthy").run
    real = planning.next_chunk

    def fails_for_one_run(policy, frozen, *args, **kwargs):
        if frozen["cutoff"] == broken.cutoff:
            raise RuntimeError("predicate changed under a planning run")
        return real(policy, frozen, *args, **kwargs)

    monkeypatch.setattr(planning, "next_chunk", fails_for_one_run)
    for chunk in chunks_of(broken):
        apply_chunk(chunk.message)

    broken.refresh_from_db()
    healthy.refresh_from_db()
    assert "predicate changed" in broken.planning_error and not broken.planned_all
    assert healthy.chunks_planned == 2  # the broken run's room went to the next one
    # A new slot joins the healthy run still planning, never the broken one.
    slot = dispatch("expire-leases", key="slot", coalesce_within=timedelta(0))
    assert slot.coalesced and slot.run.pk == healthy.pk


def test_a_sync_run_without_room_is_left_to_the_queue(account, settings, chunk_size):
    settings.CLEANUP_WINDOW = 1
    chunk_size("expire-leases", 1)
    LeaseFactory.create_batch(2, account=account, expired=True)
    queued = dispatch("expire-leases", key="queued", cutoff=timezone.now()).run

    synced = dispatch_in_process("expire-leases", key="sync").run

    assert synced.state == Run.State.RUNNING
    drain()
    synced.refresh_from_db()
    queued.refresh_from_db()
    assert queued.state == synced.state == Run.State.COMPLETED
    # The chunks planned for it once its process had stopped went to the queue.
    assert all(c.enqueued_at is not None for c in chunks_of(synced))


def test_a_chunk_delivered_after_its_run_was_cancelled_deletes_nothing(expired_leases):
    run = dispatch("expire-leases").run
    chunk = chunks_of(run)[0]
    # As if the cancel had passed this chunk by while a delivery held it.
    Run.objects.filter(pk=run.pk).update(state=Run.State.CANCELLED, planned_all=True)

    assert apply_chunk(chunk.message) == Outcome.NOOP

    chunk.refresh_from_db()
    assert chunk.state == Chunk.State.CANCELLED
    assert Lease.objects.count() == 5


def test_system_checks_refuse_an_empty_window_and_a_nullable_partition(settings, chunk_size):
    # chunk_size: its fixture puts the registry back after the test.
    from dataclasses import replace

    from django.core import checks

    from cleanup.checks import check_policies, check_window
    from cleanup.policies import get_policy, register_policy

    settings.CLEANUP_WINDOW = 0
    assert [e.id for e in check_window()] == ["cleanup.E011"]
    settings.CLEANUP_WINDOW = 4
    assert check_window() == []

    purge = get_policy("purge-cleanup-slots")  # partitioned by the slot's nullable run
    register_policy(replace(purge, name="by-nullable-run", partition_field="run"))
    errors = [e for e in check_policies() if e.id == "cleanup.E010"]
    assert [e.msg for e in errors] == [
        "Policy 'by-nullable-run' partitions its range chunks by 'run', which allows NULL."]
    assert all(isinstance(e, checks.Error) for e in errors)
