"""The database's pressure halts or slows a policy: a halt plans nothing new, is kept in
the ledger with its figures, and clears by itself (the recheck task refills the
window); an indicator that fails halts; lock waits shrink the next chunks."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django_q.models import OrmQ

from cleanup.engine import pressure, sizing, transitions, window
from cleanup.engine.dispatch import describe_dispatch, dispatch
from cleanup.engine.pressure import Level, Signal
from cleanup.engine.worker import Outcome, apply_chunk
from cleanup.models import Chunk, Halt, Run
from cleanup.observability.status import run_summary
from cleanup.policies import get_policy
from tests.engine.test_window import drain, unfinished
from tests.engine_app.factories import LeaseFactory
from tests.engine_app.models import Lease

pytestmark = pytest.mark.django_db
POLICY = "expire-leases"
NOW = {"signal": Signal(Level.OK, "batch_window", None, None, "outside the batch window")}


def batch_window(policy, db) -> Signal:
    """A host's own indicator, as CLEANUP_PRESSURE_INDICATORS names it."""
    if isinstance(NOW["signal"], Exception):
        raise NOW["signal"]
    return NOW["signal"]


@pytest.fixture
def host_indicator(settings):
    settings.CLEANUP_PRESSURE_INDICATORS = ["tests.engine.test_pressure_halts.batch_window"]
    settings.CLEANUP_PRESSURE_CHECK_SECONDS = 0
    NOW["signal"] = Signal(Level.OK, "batch_window", None, None, "outside the batch window")
    yield NOW
    NOW["signal"] = Signal(Level.OK, "batch_window", None, None, "outside the batch window")


@pytest.fixture
def backlog(account, settings, chunk_size):
    settings.CLEANUP_WINDOW = 2
    chunk_size(POLICY, 1)
    return LeaseFactory.create_batch(6, account=account, expired=True)


def halt(value=42.0, limit=10.0) -> Signal:
    return Signal(Level.HALT, "batch_window", value, limit,
                  f"nightly batch running: {value} > {limit}")


def test_a_halt_plans_nothing_keeps_its_figures_and_clears_by_itself(backlog,
                                                                     host_indicator):
    host_indicator["signal"] = halt()

    result = dispatch(POLICY, scheme="range")

    run = result.run
    assert (run.chunks_planned, run.state) == (0, Run.State.RUNNING)
    recorded = Halt.objects.get()
    assert (recorded.reason, recorded.value, recorded.limit, recorded.actor) == (
        "batch_window", 42.0, 10.0, "engine")
    assert "nightly batch running: 42.0 > 10.0" in describe_dispatch(result)
    assert run_summary(run)["halted"] == [
        f"halted {recorded_took(recorded)}: nightly batch running: 42.0 > 10.0"]
    # Nothing in flight would look again: a recheck task was sent with the run.
    assert OrmQ.objects.filter(payload__isnull=False).count() == 1

    host_indicator["signal"] = halt(value=55.0)
    # Still halted: the figures follow the reading.
    assert window.top_up_now(get_policy(POLICY)) == 0
    assert Halt.objects.get().value == 55.0

    host_indicator["signal"] = Signal(Level.OK, "batch_window", None, None, "done")
    assert window.recheck(POLICY) == 2  # the window refilled by itself
    recorded.refresh_from_db()
    assert recorded.ended_at is not None and recorded.ended_by == "engine"
    drain()
    run.refresh_from_db()
    assert run.state == Run.State.COMPLETED and Lease.objects.count() == 0


def recorded_took(halt: Halt) -> str:
    from cleanup.engine.halts import describe

    return describe(halt).removeprefix("halted ").split(":")[0]


def test_chunks_in_flight_finish_while_halted_and_nothing_fails(backlog, host_indicator):
    run = dispatch(POLICY, scheme="range").run
    host_indicator["signal"] = halt()

    while chunks := unfinished():
        assert apply_chunk(chunks[0].message) == Outcome.DELETED
    run.refresh_from_db()
    assert (run.chunks_planned, run.state) == (2, Run.State.RUNNING)
    assert not Chunk.objects.filter(state=Chunk.State.DEAD_LETTERED).exists()
    assert Chunk.objects.filter(failures__gt=0).count() == 0
    assert Halt.objects.filter(ended_at__isnull=True).count() == 1


def test_an_indicator_that_fails_halts_the_policy_and_says_which(backlog, host_indicator):
    host_indicator["signal"] = RuntimeError("batch API unreachable")

    run = dispatch(POLICY).run

    assert run.chunks_planned == 0
    recorded = Halt.objects.get()
    assert recorded.reason == pressure.INDICATOR_ERROR
    assert "batch_window failed: RuntimeError: batch API unreachable" in recorded.detail


def test_a_failed_read_in_a_chunks_transaction_keeps_its_outcome(backlog, settings):
    """The indicators run in a savepoint of their own inside the transaction that ends
    a chunk: a query error there is a halt, and the chunk's commit stands."""
    settings.CLEANUP_PRESSURE_INDICATORS = ["tests.engine.test_pressure_halts.broken_query"]
    settings.CLEANUP_PRESSURE_CHECK_SECONDS = 0
    run = dispatch(POLICY, scheme="range").run  # halted from the start: nothing planned
    assert run.chunks_planned == 0
    settings.CLEANUP_PRESSURE_INDICATORS = []
    window.top_up_now(get_policy(POLICY))
    first = unfinished()[0]
    settings.CLEANUP_PRESSURE_INDICATORS = ["tests.engine.test_pressure_halts.broken_query"]

    assert apply_chunk(first.message) == Outcome.DELETED
    assert Chunk.objects.get(pk=first.pk).state == Chunk.State.COMMITTED
    assert Halt.objects.filter(ended_at__isnull=True).get().reason == pressure.INDICATOR_ERROR


def broken_query(policy, db) -> Signal:
    with db.cursor() as cursor:
        cursor.execute("SELECT * FROM no_such_table")
    return Signal(Level.OK, "never", None, None, "")


def test_lock_waits_make_the_next_chunks_learn_against_a_quarter_of_the_budget(
        backlog, settings):
    settings.CLEANUP_CHUNK_BUDGET_MS = 40
    run = dispatch(POLICY, scheme="range").run
    for chunk in unfinished():
        apply_chunk(chunk.message)
    Chunk.objects.filter(run=run).update(duration_ms=20, planned_rows=400,
                                         cpu_wait_ms=0)  # 20 rows/ms, on an idle host
    run.refresh_from_db()
    run.next_chunk_size = 1000
    policy = get_policy(POLICY)

    steady, _ = sizing.next_size(run, policy)
    slowed, _ = sizing.next_size(run, policy, slow=True)

    assert steady == 800 and slowed == 500  # 20 rows/ms x 10 ms, bounded by the step


# transaction=True: SET LOCAL lasts to the end of the outermost transaction, which the
# chunk's own is in a worker.
@pytest.mark.django_db(transaction=True)
def test_a_chunk_transaction_names_itself_for_the_lock_waits_indicator(expired_leases):
    chunk = dispatch(POLICY).run.chunks.first()
    with transaction.atomic():
        transitions.begin(chunk, bounds=(5_000, 30_000, 5_000),
                          application=pressure.CHUNK_APPLICATION_NAME,
                          asynchronous=False, row_lock_ms=None)
        with connection.cursor() as cursor:
            cursor.execute("SHOW application_name")
            assert cursor.fetchone()[0] == pressure.CHUNK_APPLICATION_NAME
            # ... and for the outbox's triggers, which record where an event came from.
            cursor.execute("SELECT current_setting('cleanup.source'), "
                           "current_setting('cleanup.chunk_id')")
            assert cursor.fetchone() == (f"run {chunk.run_id} chunk {chunk.chunk_id}",
                                         str(chunk.chunk_id))
    with connection.cursor() as cursor:
        cursor.execute("SHOW application_name")
        assert cursor.fetchone()[0] != pressure.CHUNK_APPLICATION_NAME
