"""The pressure indicators against real PostgreSQL: a streaming standby, lock waits, vacuum.

The replica lag tests run on a throwaway primary and standby (tests/standby.py), skipped
where the server binaries or runuser are missing and failing instead under CI. The lock
and vacuum tests use django_db(transaction=True): a second and third real connection
halt and wait for locks on committed rows, which the per-test transaction would hide.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import psycopg
import pytest
from django.db import connection
from structlog.testing import capture_logs

from cleanup.engine import pressure
from cleanup.engine.pressure import CHUNK_APPLICATION_NAME, Level, Signal
from cleanup.policies import get_policy
from tests import standby
from tests.conftest import wait_for
from tests.engine_app.factories import LeaseFactory
from tests.engine_app.models import Lease
from tests.engine_app.policies import EXPIRE_LEASES

LAG_LIMIT = 1.0
LAG_TIMEOUT = 20.0


@pytest.fixture(scope="session")
def standby_pair() -> Iterator[standby.Pair]:
    reason = standby.unavailable()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the standby tests must run under CI: {reason}")
        pytest.skip(reason)
    with standby.streaming_pair() as pair:
        yield pair


@pytest.fixture
def policy():
    return get_policy(EXPIRE_LEASES)


@pytest.fixture
def primary(standby_pair):
    with psycopg.connect(**standby_pair.conninfo(standby_pair.primary_port),
                         autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS writes (id serial PRIMARY KEY, at timestamptz "
                     "DEFAULT clock_timestamp())")
        yield conn


@pytest.fixture
def replica(standby_pair):
    with psycopg.connect(**standby_pair.conninfo(standby_pair.standby_port),
                         autocommit=True) as conn:
        yield conn


def replay_lags(primary) -> list:
    return [row[0] for row in primary.execute("SELECT replay_lag FROM pg_stat_replication")]


def replayed(replica, written: int) -> bool:
    """Whether the standby has the row; before it replays the table's creation, there
    is no table to ask."""
    try:
        return replica.execute("SELECT 1 FROM writes WHERE id = %s", [written]).fetchone()
    except psycopg.errors.UndefinedTable:
        return False


def test_replica_lag_is_ok_and_zero_once_an_idle_standby_has_replayed_everything(
        policy, primary, replica):
    written = primary.execute("INSERT INTO writes DEFAULT VALUES RETURNING id").fetchone()[0]
    wait_for(lambda: replayed(replica, written), timeout=10,
             what="the standby to replay the write")
    # replay_lag reads NULL once the standby has reported twice that it replayed all.
    wait_for(lambda: replay_lags(primary) == [None], timeout=10, what="an idle standby")

    signal = pressure.replica_lag(policy, primary, limit=LAG_LIMIT)

    assert signal == Signal(Level.OK, "replica_lag", 0.0, LAG_LIMIT,
                            "replica lag 0.0 s <= 1 s (1 standby connection)")


def test_replica_lag_holds_while_replay_is_paused_and_clears_once_it_resumes(
        policy, primary, replica):
    wait_for(lambda: replay_lags(primary) == [None], timeout=10, what="an idle standby")
    replica.execute("SELECT pg_wal_replay_pause()")
    paused = time.monotonic()
    try:
        signal = pressure.replica_lag(policy, primary, limit=LAG_LIMIT)
        while signal.level is not Level.HALT and time.monotonic() - paused < LAG_TIMEOUT:
            primary.execute("INSERT INTO writes DEFAULT VALUES")
            time.sleep(0.2)
            signal = pressure.replica_lag(policy, primary, limit=LAG_LIMIT)
        detected = time.monotonic() - paused
    finally:
        replica.execute("SELECT pg_wal_replay_resume()")
    resumed = time.monotonic()

    assert signal.level is Level.HALT, signal
    assert signal.reason == "replica_lag"
    assert signal.value is not None and signal.value > LAG_LIMIT
    assert signal.detail.startswith(f"replica lag {signal.value:.1f} s > 1 s")
    print(f"\nreplay paused: HOLD after {detected:.1f} s at {signal.value:.2f} s of lag")

    after = wait_for(lambda: (s := pressure.replica_lag(policy, primary, limit=LAG_LIMIT))
                     .level is Level.OK and s, timeout=LAG_TIMEOUT, what="the lag to clear")
    assert after.value <= LAG_LIMIT
    print(f"replay resumed: OK after {time.monotonic() - resumed:.1f} s at {after.value:.2f} s")


def test_replica_lag_is_ok_without_a_standby(policy, standby_pair):
    # The standby's own view of replication is empty: it has no walsender.
    with psycopg.connect(**standby_pair.conninfo(standby_pair.standby_port)) as replica:
        signal = pressure.replica_lag(policy, replica)

    assert signal == Signal(Level.OK, "replica_lag", None, pressure.MAX_REPLICA_LAG,
                            "no standby connected")


# -- lock waits and vacuum, on the test database ----------------------------------------


def session(application_name: str = "", **options) -> psycopg.Connection:
    """A new connection to the test database."""
    settings = connection.settings_dict
    return psycopg.connect(host=settings["HOST"] or None, port=settings["PORT"] or None,
                           user=settings["USER"] or None, password=settings["PASSWORD"] or None,
                           dbname=settings["NAME"], application_name=application_name,
                           **options)


def waits_on_lock(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
        row = cursor.fetchone()
    return bool(row) and row[0] == "Lock"


@contextmanager
def renewal_blocked(lease_id: int, holder_name: str = CHUNK_APPLICATION_NAME,
                    waiter_name: str = "renewal") -> Iterator[float]:
    """Lock ``lease_id``'s row in a transaction named as a chunk's will be, start a renewal
    of it on another session, and yield the monotonic time the renewal started once it
    waits on the lock; the lock is released (and the renewal completes) on exit."""
    with session(autocommit=True) as holder, session(waiter_name, autocommit=True) as waiter:
        holder.execute("BEGIN")
        holder.execute(f"SET LOCAL application_name = '{holder_name}'")
        holder.execute("SELECT FROM engine_app_lease WHERE id = %s FOR UPDATE", [lease_id])
        renewal = threading.Thread(target=waiter.execute, daemon=True, args=(
            "UPDATE engine_app_lease SET expires_at = expires_at + interval '1 hour' "
            "WHERE id = %s", [lease_id]))
        started = time.monotonic()
        renewal.start()
        try:
            wait_for(lambda: waits_on_lock(waiter.info.backend_pid), timeout=5, interval=0.01,
                     what="the renewal to wait on the row lock")
            yield started
        finally:
            holder.execute("ROLLBACK")
            renewal.join(timeout=10)


@pytest.mark.django_db(transaction=True)
def test_a_session_waiting_on_a_chunk_past_the_limit_slows_cleanup(policy, expired_leases):
    lease = expired_leases[0]
    with renewal_blocked(lease.pk) as started:
        signal = wait_for(lambda: (s := pressure.lock_waits(policy, connection, limit_ms=200))
                          .level is Level.SLOW and s, timeout=5, interval=0.02,
                          what="lock_waits to see the renewal")
        seen_after = time.monotonic() - started

    assert signal.reason == "lock_waits" and signal.limit == 200
    assert signal.value > 200
    assert seen_after >= 0.2
    assert signal.detail == f"1 session waiting on a chunk's lock, longest " \
                            f"{signal.value:.0f} ms > 200 ms"
    print(f"\nrenewal blocked: SLOW {seen_after * 1000:.0f} ms after it started, "
          f"wait read {signal.value:.0f} ms")
    assert pressure.lock_waits(policy, connection).level is Level.OK


@pytest.mark.django_db(transaction=True)
def test_a_wait_shorter_than_the_limit_is_ok(policy, expired_leases):
    with renewal_blocked(expired_leases[0].pk):
        time.sleep(0.3)
        signal = pressure.lock_waits(policy, connection, limit_ms=60_000)

    assert signal == Signal(Level.OK, "lock_waits", None, 60_000,
                            "no session waits over 60000 ms on a chunk's lock")


@pytest.mark.django_db(transaction=True)
def test_waits_on_a_lock_cleanup_does_not_hold_are_not_counted(policy, expired_leases):
    with renewal_blocked(expired_leases[0].pk, holder_name="product"):
        time.sleep(0.3)
        signal = pressure.lock_waits(policy, connection, limit_ms=100)

    assert signal.level is Level.OK


@pytest.mark.django_db(transaction=True)
def test_a_chunk_waiting_on_a_chunk_is_not_counted(policy, expired_leases):
    with renewal_blocked(expired_leases[0].pk, waiter_name=CHUNK_APPLICATION_NAME):
        time.sleep(0.3)
        signal = pressure.lock_waits(policy, connection, limit_ms=100)

    assert signal.level is Level.OK


def vacuum_phase() -> str | None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT phase FROM pg_stat_progress_vacuum "
                       "WHERE relid = 'engine_app_lease'::regclass")
        row = cursor.fetchone()
    return row[0] if row else None


@contextmanager
def vacuum_in_progress(expired_leases) -> Iterator[None]:
    """A manual VACUUM of the leases table kept in progress for the block.

    A vacuum that can truncate empty pages at the table's end needs an exclusive lock
    for it; while another session holds even an ACCESS SHARE lock, it retries for 5 s
    in the phase "truncating heap", in progress the whole time. LOCK TABLE takes no
    snapshot, so the lock keeps no deleted row from being removable.
    """
    account = expired_leases[0].account
    Lease.objects.bulk_create(LeaseFactory.build_batch(300, account=account))
    Lease.objects.exclude(pk__in=[lease.pk for lease in expired_leases]).delete()
    with session(autocommit=True) as locker, session(autocommit=True) as vacuumer:
        locker.execute("BEGIN")
        locker.execute("LOCK TABLE engine_app_lease IN ACCESS SHARE MODE")
        try:
            # An autovacuum's snapshot in the test database can leave the deleted rows
            # unremovable: that vacuum ends at once, truncating nothing, and is tried again.
            deadline = time.monotonic() + 10
            while vacuum_phase() != "truncating heap" and time.monotonic() < deadline:
                run = threading.Thread(target=vacuumer.execute, args=("VACUUM engine_app_lease",))
                run.start()
                while run.is_alive() and vacuum_phase() != "truncating heap":
                    time.sleep(0.01)
            yield
        finally:
            locker.execute("ROLLBACK")
            run.join(timeout=10)


@pytest.mark.django_db(transaction=True)
def test_a_vacuum_on_the_policys_table_slows_or_holds_cleanup(policy, expired_leases):
    assert pressure.vacuum(policy, connection).level is Level.OK
    with vacuum_in_progress(expired_leases):
        slow = pressure.vacuum(policy, connection)
        held = pressure.vacuum(policy, connection, halt_on_vacuum=True)

    assert slow == Signal(Level.SLOW, "vacuum", 1.0, None,
                          "vacuum of engine_app_lease running: truncating heap (manual)")
    assert held.level is Level.HALT
    assert pressure.vacuum(policy, connection).level is Level.OK


# -- evaluate and cached ----------------------------------------------------------------


def fixed(level: Level, reason: str):
    def indicator(policy, connection) -> Signal:
        return Signal(level, reason, None, None, reason)
    return indicator


def broken(policy, connection, *, message: str = "relation does not exist") -> Signal:
    raise RuntimeError(message)


def test_evaluate_keeps_the_worst_signal(policy):
    signal = pressure.evaluate(policy, [fixed(Level.OK, "a"), fixed(Level.SLOW, "b"),
                                        fixed(Level.OK, "c")], None)

    assert (signal.level, signal.reason) == (Level.SLOW, "b")


def test_evaluate_stops_at_the_first_hold(policy):
    called = []

    def later(policy, connection):
        called.append(True)
        return fixed(Level.OK, "later")(policy, connection)

    signal = pressure.evaluate(policy, [fixed(Level.SLOW, "a"), fixed(Level.HALT, "b"), later],
                               None)

    assert (signal.level, signal.reason, called) == (Level.HALT, "b", [])


def test_evaluate_without_indicators_is_ok(policy):
    assert pressure.evaluate(policy, [], None).level is Level.OK


def test_an_indicator_that_raises_holds_and_is_logged(policy):
    with capture_logs() as logs:
        signal = pressure.evaluate(policy, [fixed(Level.OK, "a"),
                                            partial(broken, message="no such view")], None)

    assert signal == Signal(Level.HALT, "indicator_error", None, None,
                            "broken failed: RuntimeError: no such view")
    assert [(entry["event"], entry["log_level"], entry["indicator"], entry["policy"])
            for entry in logs] == [("pressure indicator failed; halting", "warning", "broken",
                                    EXPIRE_LEASES)]


@pytest.fixture
def empty_cache():
    pressure.forget()
    yield
    pressure.forget()


def test_cached_keeps_a_policys_signal_for_its_seconds(empty_cache):
    computed = []

    def compute():
        computed.append(True)
        return Signal(Level.SLOW, "lock_waits", float(len(computed)), 200, "")

    first = pressure.cached("a", 60, compute)
    again = pressure.cached("a", 60, compute)
    other = pressure.cached("b", 60, compute)
    expired = pressure.cached("a", 0, compute)

    assert (first.value, again.value, other.value, expired.value) == (1, 1, 2, 3)
