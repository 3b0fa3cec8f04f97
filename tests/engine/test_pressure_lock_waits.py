"""A holder's renewal blocked by a chunk: the following chunks shrink, and grow back once
nothing waits, in a whole run of expire-leases delivered chunk by chunk.

django_db(transaction=True): the chunk, the holder's renewal and the test each run on a
real connection of their own, and a lock wait is only seen between sessions that see one
another's commits, which the per-test transaction would hide.

A row trigger on the leases table, installed for the test, makes each deleted row cost
PACE_MS inside the chunk's transaction (so a chunk's pace is bounded by a known figure
and the sizes it learns are exact), and holds the chunk open on one lease's row lock
until the test opens a gate: that is when a holder's renewal waits on the chunk past
CLEANUP_MAX_LOCK_WAIT_MS. The gate is an advisory lock, so the test decides from
pg_locks and pg_stat_activity, never from a clock, when the wait is long enough.
"""

from __future__ import annotations

import queue
import threading

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from cleanup.engine import pressure
from cleanup.engine.dispatch import dispatch
from cleanup.engine.pressure import CHUNK_APPLICATION_NAME, Level, Signal
from cleanup.engine.sizing import SLOW_BUDGET_SHARE, STEP
from cleanup.engine.worker import Outcome, apply_chunk
from cleanup.models import Chunk, Run
from cleanup.policies import get_policy
from tests.conftest import wait_for
from tests.engine.test_concurrency import Worker
from tests.engine.test_pressure import session
from tests.engine_app.factories import LeaseFactory
from tests.engine_app.models import Lease
from tests.engine_app.policies import EXPIRE_LEASES
from tests.engine_app.services import renew_lease

pytestmark = pytest.mark.django_db(transaction=True)

FULL = 8  # rows of a chunk when nothing waits: the items ceiling
LIMIT_MS = 50
PACE_MS = 25
# A chunk's pace is at most 1 / PACE_MS rows per ms, so under lock waits a chunk learns
# at most SLOW_BUDGET_SHARE x BUDGET_MS / PACE_MS = 3.75 rows: below FULL / STEP, the
# step down is exact. Without waits the pace may fall to 8 rows per 375 ms (a chunk of
# FULL rows taking 175 ms over its sleeps) and still learn FULL.
BUDGET_MS = 375
GATE = (4242, 2)  # the advisory lock the trigger waits for on the blocked lease's row
EXPIRED = 44  # chunks of 8, 8, 8 (the renewal waits on the third), 4, 8, 8

READINGS: list[Signal] = []


ENGINE_LOCK_WAITS = pressure.lock_waits


def lock_waits_read(policy, db, **limits) -> Signal:
    """The engine's own lock-waits indicator, its readings at each chunk's end (in the
    chunk's transaction, where the waits it causes can be seen) kept in READINGS."""
    signal = ENGINE_LOCK_WAITS(policy, db, **limits)
    if pressure._host_readings_only.get():
        READINGS.append(signal)
    return signal


def install_trigger(blocked_lease: int = 0) -> None:
    """Each deleted lease costs PACE_MS; deleting ``blocked_lease`` (its row locked by the
    DELETE already: a BEFORE ROW trigger runs on the locked row) waits for the gate."""
    table = Lease._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"""
            CREATE OR REPLACE FUNCTION test_chunk_pace() RETURNS trigger AS $$
            BEGIN
                PERFORM pg_sleep({PACE_MS / 1000});
                IF OLD.id = {int(blocked_lease)} THEN
                    PERFORM pg_advisory_xact_lock_shared({GATE[0]}, {GATE[1]});
                END IF;
                RETURN OLD;
            END $$ LANGUAGE plpgsql
        """)
        cursor.execute(f"DROP TRIGGER IF EXISTS test_chunk_pace ON {table}")
        cursor.execute(f"CREATE TRIGGER test_chunk_pace BEFORE DELETE ON {table} "
                       "FOR EACH ROW EXECUTE FUNCTION test_chunk_pace()")


@pytest.fixture
def paced_deletes():
    install_trigger()
    yield install_trigger
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TRIGGER IF EXISTS test_chunk_pace ON {Lease._meta.db_table}")
        cursor.execute("DROP FUNCTION IF EXISTS test_chunk_pace()")


@pytest.fixture
def learning(settings, chunk_size, monkeypatch):
    settings.CLEANUP_WINDOW = 1  # one chunk at a time: each size is read off the ledger
    settings.CLEANUP_CHUNK_BUDGET_MS = BUDGET_MS
    settings.CLEANUP_MAX_ITEMS_PER_CHUNK = FULL
    settings.CLEANUP_MIN_ROWS_PER_CHUNK = 1
    settings.CLEANUP_MAX_LOCK_WAIT_MS = LIMIT_MS
    settings.CLEANUP_PRESSURE_CHECK_SECONDS = 0  # each top-up reads afresh
    monkeypatch.setattr(pressure, "lock_waits", lock_waits_read)
    chunk_size(EXPIRE_LEASES, FULL)
    READINGS.clear()
    yield
    READINGS.clear()


def next_unfinished(run: Run) -> Chunk:
    (chunk,) = run.chunks.filter(state__in=Chunk.UNFINISHED)
    return chunk


def waiting_on_gate() -> int | None:
    """The pid of the chunk whose trigger waits for the gate: it holds the row lock."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT locks.pid, activity.application_name FROM pg_locks locks "
                       "JOIN pg_stat_activity activity USING (pid) "
                       "WHERE locks.locktype = 'advisory' AND NOT locks.granted "
                       "AND activity.datname = current_database() "
                       "AND locks.classid = %s AND locks.objid = %s", list(GATE))
        row = cursor.fetchone()
    if row is None:
        return None
    assert row[1] == CHUNK_APPLICATION_NAME
    return row[0]


def renewal_wait(pid: int, chunk_pid: int) -> float | None:
    """How long the renewal's session has waited for a lock the chunk holds, in ms; None
    while it does not wait on the chunk."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT activity.wait_event_type, "
            "       extract(epoch FROM clock_timestamp() - locks.waitstart) * 1000, "
            "       %s = ANY (pg_blocking_pids(activity.pid)) "
            "FROM pg_stat_activity activity "
            "JOIN pg_locks locks ON locks.pid = activity.pid AND NOT locks.granted "
            "WHERE activity.pid = %s AND locks.waitstart IS NOT NULL", [chunk_pid, pid])
        row = cursor.fetchone()
    if row is None or row[0] != "Lock" or not row[2]:
        return None
    return float(row[1])


def renew_as_holder(lease_id: int, pids: queue.Queue) -> bool:
    """Renew the lease as its holder does; whether there was still a lease to renew."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pids.put(cursor.fetchone()[0])
    renew_lease(lease_id)
    return Lease.objects.filter(pk=lease_id).exists()


@pytest.mark.usefixtures("row_locks_waited")
def test_a_renewal_blocked_by_a_chunk_shrinks_the_next_chunks_until_the_waits_stop(
        learning, paced_deletes, account):
    expired = {lease.pk for lease in LeaseFactory.create_batch(EXPIRED, account=account,
                                                               expired=True)}
    ineligible = {lease.pk for lease in [
        *LeaseFactory.create_batch(3, account=account),  # not expired yet
        *LeaseFactory.create_batch(3, account=account, expired=True,
                                   state=Lease.State.KEPT),
    ]}
    policy = get_policy(EXPIRE_LEASES)
    run = dispatch(EXPIRE_LEASES).run
    for _ in range(2):
        assert apply_chunk(next_unfinished(run).message) == Outcome.DELETED

    # The third chunk: a holder renews one of its leases while its DELETE holds the row.
    blocking = next_unfinished(run)
    blocked_lease = blocking.message["items"][3][0]
    paced_deletes(blocked_lease)
    with session(autocommit=True) as gate:
        gate.execute("SELECT pg_advisory_lock(%s, %s)", GATE)
        try:
            delivery = Worker(apply_chunk, blocking.message)
            delivery.start()
            chunk_pid = wait_for(waiting_on_gate, timeout=10, interval=0.01,
                                 what="the chunk to lock the renewed lease's row")
            pids: queue.Queue = queue.Queue()
            holder = Worker(renew_as_holder, blocked_lease, pids)
            holder.start()
            holder_pid = pids.get(timeout=10)
            waited_ms = wait_for(
                lambda: (ms := renewal_wait(holder_pid, chunk_pid)) is not None
                and ms > LIMIT_MS and ms, timeout=10, interval=0.01,
                what=f"the renewal to wait on the chunk over {LIMIT_MS} ms")
            seen = pressure.lock_waits(policy, connection, limit_ms=LIMIT_MS)
        finally:
            gate.execute("SELECT pg_advisory_unlock(%s, %s)", GATE)
    assert delivery.outcome() == Outcome.DELETED
    assert seen.level is Level.SLOW and seen.value > LIMIT_MS, seen
    # The renewal came after the DELETE had locked the expired lease: it finds it gone.
    # Only a renewal that commits first keeps a lease (below).
    assert holder.outcome() is False

    # A holder renews a lease of the chunk planned while the wait was seen: it survives.
    shrunk = next_unfinished(run)
    renewed_lease = shrunk.message["items"][0][0]
    renew_lease(renewed_lease)
    renewed_until = Lease.objects.get(pk=renewed_lease).expires_at
    assert renewed_until > timezone.now()
    while run.chunks.filter(state__in=Chunk.UNFINISHED).exists():
        assert apply_chunk(next_unfinished(run).message) == Outcome.DELETED

    run.refresh_from_db()
    chunks = list(run.chunks.order_by("chunk_id"))
    sizes = [chunk.planned_rows for chunk in chunks]
    print(f"\nrenewal waited {waited_ms:.0f} ms on chunk #{blocking.chunk_id}; "
          f"chunk sizes {sizes}; readings {[s.level.name for s in READINGS]}; "
          f"durations {[chunk.duration_ms for chunk in chunks]} ms")
    # The top-up of the chunk the renewal waited on read the wait; no other chunk's end
    # did (the dispatch's first window is planned outside any chunk).
    assert [signal.level for signal in READINGS] == [Level.OK] * 2 + [Level.SLOW] + \
        [Level.OK] * 3
    assert READINGS[2].value > LIMIT_MS
    # Planned under the wait: a step down; once nothing waits, back up to the full size.
    assert sizes == [FULL, FULL, FULL, FULL // STEP, FULL, FULL]
    assert run.next_chunk_size == FULL
    assert SLOW_BUDGET_SHARE * BUDGET_MS / PACE_MS < FULL // STEP  # why the step is exact

    # The ledger equals the table: every expired lease gone but the renewed one, nothing
    # ineligible deleted, and the renewed lease survived with its new expiry.
    assert run.state == Run.State.COMPLETED
    assert [chunk.rows_deleted for chunk in chunks] == [8, 8, 8, 3, 8, 8]
    assert sum(sizes) == run.candidates == EXPIRED
    left = set(Lease.objects.values_list("pk", flat=True))
    assert left == ineligible | {renewed_lease}
    assert sum(chunk.rows_deleted for chunk in chunks) == len(expired - left) == EXPIRED - 1
    assert Lease.objects.get(pk=renewed_lease).expires_at == renewed_until

    # Nothing waits any more: the indicator, and the policy's whole signal, read OK.
    assert pressure.lock_waits(policy, connection, limit_ms=LIMIT_MS).level is Level.OK
    pressure.forget(EXPIRE_LEASES)
    assert pressure.check(policy).level is Level.OK


def other_database(application_name: str = "") -> psycopg.Connection:
    """A session on the server's ``postgres`` database: another database than the test's."""
    settings = connection.settings_dict
    return psycopg.connect(host=settings["HOST"] or None, port=settings["PORT"] or None,
                           user=settings["USER"] or None, password=settings["PASSWORD"] or None,
                           dbname="postgres", application_name=application_name,
                           autocommit=True)


def test_lock_waits_in_another_database_do_not_slow_cleanup():
    """The lock-waits indicator counts the sessions this database's chunks keep waiting:
    another database's cleanup on the same server is that database's pressure."""
    with other_database() as holder, other_database("renewal") as waiter:
        holder.execute("BEGIN")
        holder.execute(f"SET LOCAL application_name = '{CHUNK_APPLICATION_NAME}'")
        holder.execute("SELECT pg_advisory_xact_lock(%s, %s)", GATE)
        blocked = threading.Thread(target=waiter.execute, daemon=True,
                                   args=("SELECT pg_advisory_lock(%s, %s)", GATE))
        blocked.start()
        try:
            wait_for(lambda: waited_over(waiter.info.backend_pid, LIMIT_MS), timeout=10,
                     interval=0.01, what=f"a wait over {LIMIT_MS} ms in the other database")
            signal = pressure.lock_waits(get_policy(EXPIRE_LEASES), connection,
                                         limit_ms=LIMIT_MS)
        finally:
            holder.execute("ROLLBACK")
            blocked.join(timeout=10)
            waiter.execute("SELECT pg_advisory_unlock_all()")

    assert signal.level is Level.OK, signal


def waited_over(pid: int, limit_ms: float) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT FROM pg_locks WHERE pid = %s AND NOT granted "
                       "AND waitstart < clock_timestamp() - make_interval(secs => %s)",
                       [pid, limit_ms / 1000])
        return cursor.fetchone() is not None
