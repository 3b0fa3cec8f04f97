"""A new run's chunk size comes from a transaction-time budget learned from the ledger."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from cleanup.engine import sizing, transitions
from cleanup.engine.dispatch import dispatch
from cleanup.models import Chunk, Run
from cleanup.policies import ITEMS, RANGE, get_policy
from tests.engine_app.factories import LeaseFactory

pytestmark = pytest.mark.django_db
EXPIRE = "expire-leases"


@pytest.fixture(autouse=True)
def learning(settings):
    settings.CLEANUP_CHUNK_BUDGET_MS = 50
    settings.CLEANUP_MIN_ROWS_PER_CHUNK = 10
    settings.CLEANUP_MAX_ITEMS_PER_CHUNK = 2_000
    settings.CLEANUP_MAX_RANGE_ROWS_PER_CHUNK = 100_000


def history(scheme: str, *, chunks: int, rows: int, duration_ms: int, policy=EXPIRE,
            span: int = 0, cpu_wait_ms: int | None = None) -> Run:
    """Ledger rows of a finished run whose chunks each took ``duration_ms`` for ``rows``
    (range chunks spanning ``span`` ids), of which their worker waited ``cpu_wait_ms``
    for a CPU."""
    now = timezone.now()
    run = Run.objects.create(policy=policy, dispatch_key=f"test:{uuid.uuid4()}", cutoff=now,
                             scheme=scheme, state=Run.State.COMPLETED)
    Chunk.objects.bulk_create(
        Chunk(run=run, chunk_id=seq, state=Chunk.State.ACKNOWLEDGED,
              message={"start_id": seq * span, "end_id": (seq + 1) * span} if span else {},
              planned_rows=rows, rows_deleted=rows, duration_ms=duration_ms,
              cpu_wait_ms=cpu_wait_ms, committed_at=now)
        for seq in range(1, chunks + 1)
    )
    return run


def test_without_enough_history_the_policys_chunk_size_is_used():
    history(RANGE, chunks=sizing.ENOUGH - 1, rows=1_000, duration_ms=1)
    assert sizing.chunk_size(get_policy(EXPIRE), RANGE) == get_policy(EXPIRE).chunk_size


def test_size_fills_the_budget_at_the_learned_rate():
    history(RANGE, chunks=sizing.ENOUGH, rows=1_000, duration_ms=5)  # 200 rows per ms
    assert sizing.chunk_size(get_policy(EXPIRE), RANGE) == 50 * 200


def test_each_scheme_learns_from_its_own_chunks_and_has_its_own_ceiling():
    history(RANGE, chunks=sizing.ENOUGH, rows=10_000, duration_ms=1)
    history(ITEMS, chunks=sizing.ENOUGH, rows=500, duration_ms=25)  # 20 rows per ms
    assert sizing.chunk_size(get_policy(EXPIRE), RANGE) == 100_000
    assert sizing.chunk_size(get_policy(EXPIRE), ITEMS) == 50 * 20


def test_items_ceiling_bounds_the_message_size():
    history(ITEMS, chunks=sizing.ENOUGH, rows=5_000, duration_ms=1)
    assert sizing.chunk_size(get_policy(EXPIRE), ITEMS) == 2_000


def test_slow_chunks_shrink_the_size_down_to_the_floor():
    history(RANGE, chunks=sizing.ENOUGH, rows=500, duration_ms=5_000)
    assert sizing.chunk_size(get_policy(EXPIRE), RANGE) == 10


def test_other_policies_history_does_not_count():
    history(RANGE, chunks=sizing.ENOUGH, rows=1_000, duration_ms=5,
            policy="purge-lease-logs")
    assert sizing.chunk_size(get_policy(EXPIRE), RANGE) == get_policy(EXPIRE).chunk_size


def test_a_zero_budget_turns_learning_off(settings):
    settings.CLEANUP_CHUNK_BUDGET_MS = 0
    history(RANGE, chunks=sizing.ENOUGH, rows=1_000, duration_ms=5)
    assert sizing.chunk_size(get_policy(EXPIRE), RANGE) == get_policy(EXPIRE).chunk_size


def test_dispatch_plans_with_the_learned_size_and_records_it(account, chunk_size):
    chunk_size(EXPIRE, 2)
    LeaseFactory.create_batch(25, account=account, expired=True)
    history(RANGE, chunks=sizing.ENOUGH, rows=100, duration_ms=500)  # 0.2 rows per ms: 10 rows
    run = dispatch(EXPIRE, scheme=RANGE).run
    assert run.chunk_size == 10
    assert [c.planned_rows for c in run.chunks.order_by("chunk_id")] == [10, 10, 5]


def test_a_few_slow_chunks_do_not_shrink_the_size():
    run = history(RANGE, chunks=7, rows=1_000, duration_ms=5)
    # Two of the run's chunks met a lock wait or a sparse range.
    Chunk.objects.filter(run=run, chunk_id__in=[2, 5]).update(duration_ms=400)
    assert sizing.chunk_size(get_policy(EXPIRE), RANGE) == 50 * 200


def test_range_span_is_capped_at_a_multiple_of_the_typical_chunks_span():
    history(RANGE, chunks=9, rows=1_000, duration_ms=5, span=4_000)  # 4 ids per row
    history(RANGE, chunks=2, rows=1_000, duration_ms=5, span=900_000)  # a sparse edge
    assert sizing.max_span(get_policy(EXPIRE), RANGE, 2_000) == sizing.SPAN_FACTOR * 2_000 * 4


def test_no_span_cap_without_history_for_items_or_with_learning_off(settings):
    policy = get_policy(EXPIRE)
    assert sizing.max_span(policy, RANGE, 2_000) is None
    history(RANGE, chunks=sizing.ENOUGH, rows=1_000, duration_ms=5, span=4_000)
    assert sizing.max_span(policy, ITEMS, 2_000) is None
    settings.CLEANUP_CHUNK_BUDGET_MS = 0
    assert sizing.max_span(policy, RANGE, 2_000) is None


def test_dispatch_records_the_span_cap_and_plans_within_it(account, chunk_size):
    leases = LeaseFactory.create_batch(12, account=account, expired=True)
    history(RANGE, chunks=sizing.ENOUGH, rows=20, duration_ms=1, span=20)  # 1 id per row
    run = dispatch(EXPIRE, scheme=RANGE).run
    assert (run.chunk_size, run.max_span) == (1_000, sizing.SPAN_FACTOR * 1_000)
    assert sum(c.planned_rows for c in run.chunks.all()) == len(leases)


def test_a_run_under_a_passing_load_does_not_set_the_next_runs_start():
    history(RANGE, chunks=sizing.ENOUGH, rows=1_000, duration_ms=5)  # 200 rows per ms
    # The latest run met a busier database: a little slower (150 rows per ms), with more
    # chunks than the quiet run had.
    history(RANGE, chunks=sizing.PER_RUN, rows=1_000, duration_ms=7)
    assert sizing.chunk_size(get_policy(EXPIRE), RANGE) == 50 * 200


def test_a_new_run_starts_at_most_a_step_above_the_latest_runs_pace():
    history(RANGE, chunks=sizing.ENOUGH, rows=1_000, duration_ms=5)  # 200 rows per ms
    # Ten times slower since: a grown table, or a load that has not passed. The first
    # window is planned for at most twice the latest pace, not for the old database.
    history(RANGE, chunks=sizing.PER_RUN, rows=1_000, duration_ms=50)  # 20 rows per ms
    assert sizing.chunk_size(get_policy(EXPIRE), RANGE) == 50 * 20 * sizing.STEP


def test_short_runs_are_learned_from_together():
    # A frequent schedule over a small backlog: runs of two chunks each, at 100, 200
    # and 250 rows per ms; together they have enough chunks, and their median is 200.
    for duration_ms in (10, 5, 4):
        history(RANGE, chunks=2, rows=1_000, duration_ms=duration_ms)
    assert sizing.chunk_size(get_policy(EXPIRE), RANGE) == 50 * 200


def test_a_short_run_is_left_out_beside_one_with_enough_chunks():
    history(RANGE, chunks=sizing.ENOUGH, rows=1_000, duration_ms=5)  # 200 rows per ms
    history(RANGE, chunks=2, rows=1_000, duration_ms=1)  # 1,000 rows per ms, 2 chunks
    assert sizing.chunk_size(get_policy(EXPIRE), RANGE) == 50 * 200


def test_a_new_run_learns_from_each_recent_runs_latest_chunks_only():
    quiet = history(RANGE, chunks=sizing.PER_RUN, rows=1_000, duration_ms=5)
    # The quiet run's earliest chunks were slow: older than its latest PER_RUN.
    earlier = timezone.now() - timedelta(minutes=5)
    Chunk.objects.bulk_create(
        Chunk(run=quiet, chunk_id=100 + seq, state=Chunk.State.ACKNOWLEDGED, message={},
              planned_rows=1_000, rows_deleted=1_000, duration_ms=500, committed_at=earlier)
        for seq in range(sizing.PER_RUN * 2)
    )
    assert sizing.chunk_size(get_policy(EXPIRE), RANGE) == 50 * 200


def test_a_workers_wait_for_a_cpu_is_not_the_databases_time():
    # 10 ms a chunk, 5 of them spent by the worker waiting for a CPU: the database
    # took 5 ms for the 1,000 rows.
    history(RANGE, chunks=sizing.ENOUGH, rows=1_000, duration_ms=10, cpu_wait_ms=5)
    assert sizing.chunk_size(get_policy(EXPIRE), RANGE) == 50 * 200


def test_at_most_half_of_a_chunks_time_is_taken_for_its_workers_wait():
    # 95 of 100 ms waiting for a CPU: the chunk's locks were held for all 100, so its
    # pace is read from no less than half of them.
    history(RANGE, chunks=sizing.ENOUGH, rows=1_000, duration_ms=100, cpu_wait_ms=95)
    assert sizing.chunk_size(get_policy(EXPIRE), RANGE) == 50 * 20


def test_within_a_run_a_busy_client_does_not_shrink_the_next_chunk():
    # 1,000 rows in 10 ms, 5 of them waiting for a CPU: 200 rows per ms of the
    # database's time; the next chunk is 6,000 rows now.
    run = history(RANGE, chunks=sizing.LATEST, rows=1_000, duration_ms=10, cpu_wait_ms=5)
    run.state, run.next_chunk_size = Run.State.RUNNING, 6_000
    size, _ = sizing.next_size(run, get_policy(EXPIRE))
    assert size == 50 * 200
    # The same time without the wait is a slower database: 100 rows per ms.
    Chunk.objects.filter(run=run).update(cpu_wait_ms=None)
    size, _ = sizing.next_size(run, get_policy(EXPIRE))
    assert size == 50 * 100


@pytest.mark.parametrize("scheme, span", [(RANGE, 3_000), (ITEMS, 0)])
def test_the_pace_read_with_the_locked_run_is_the_one_read_on_its_own(scheme, span):
    # A chunk's top-up reads the run's latest chunks in the call that locks it.
    run = history(scheme, chunks=sizing.LATEST + 2, rows=1_000, duration_ms=10, span=span,
                  cpu_wait_ms=2)
    Chunk.objects.filter(run=run, chunk_id=1).update(duration_ms=500)  # the oldest: left out
    run.state, run.next_chunk_size = Run.State.RUNNING, 6_000
    read = transitions.lock_run(run.pk, sizing.LATEST)
    assert len(read.latest_chunks) == sizing.LATEST
    if scheme == ITEMS:  # its large messages are not read for a span they do not carry
        assert {chunk["message__start_id"] for chunk in read.latest_chunks} == {None}
    policy = get_policy(EXPIRE)
    together = sizing.next_size(run, policy, latest=read.latest_chunks)
    assert together == sizing.next_size(run, policy)
    # 125 rows a ms of the database's time, 6,250 rows in the budget (items: their ceiling).
    assert together[0] == (2_000 if scheme == ITEMS else 50 * 1_000 // 8)
    assert (together[1] is None) == (scheme == ITEMS)
