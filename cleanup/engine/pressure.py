"""Whether the database a policy cleans can take more cleanup now: indicators and their worst.

An indicator reads one thing from PostgreSQL and returns a :class:`Signal`: carry on
(``OK``), slow down (``SLOW``) or halt (``HALT``: the policy plans nothing new), with
the reason, the value it read, the limit it compared it to, and a sentence for an
operator. ``evaluate`` runs a policy's indicators and keeps the worst signal; one that
raises is a halt, since cleanup can always wait and a database under load is where
reading it is likely to fail. ``cached`` keeps a policy's last signal for a few seconds
(``CLEANUP_PRESSURE_CHECK_SECONDS``, 2 by default), so planning each chunk does not
query the catalogs each time.

An indicator is ``(policy, connection) -> Signal``; its limits are keyword arguments
(``functools.partial`` sets others). ``connection`` is Django's or any DB-API
connection whose ``cursor()`` is a context manager (psycopg's), in autocommit: a failed
read aborts an open transaction. Seeing other roles' sessions (an autovacuum's table)
takes the ``pg_read_all_stats`` role.
"""

from __future__ import annotations

import contextvars
import functools
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Any

import structlog
from django.db import connection, transaction
from django.utils.module_loading import import_string

from cleanup.conf import conf

if TYPE_CHECKING:
    from cleanup.policies import Policy

log = structlog.get_logger("cleanup.pressure")

# What a chunk's transaction will set with SET LOCAL application_name, so the sessions
# cleanup makes wait can be told from the rest.
CHUNK_APPLICATION_NAME = "cleanup-chunk"
# Defaults of the limits; ``check`` reads CLEANUP_MAX_REPLICA_LAG (seconds) and
# CLEANUP_MAX_LOCK_WAIT_MS.
MAX_REPLICA_LAG = 10.0
MAX_LOCK_WAIT_MS = 200.0
INDICATOR_ERROR = "indicator_error"
# An indicator slower than this halts: its answer describes a database that was
# already somewhere else, and the policy waits for one that answers in time.
INDICATOR_SECONDS = 2.0


class Level(IntEnum):
    """How hard to yield; a greater level is worse."""

    OK = 0
    SLOW = 1
    HALT = 2


@dataclass(frozen=True)
class Signal:
    """One reading: its level, a short machine name, what was read, and against what."""

    level: Level
    reason: str
    value: float | None
    limit: float | None
    detail: str


Indicator = Callable[["Policy", Any], Signal]

# Every walsender counts, so every connected standby without configuration. The primary
# measures replay_lag from the standby's replies (each wal_receiver_status_interval,
# 10 s by default) and interpolates while replay is stuck; NULL once the standby has
# replayed everything and said so twice, that is an idle pair.
_REPLICA_LAG = """
    SELECT count(*), coalesce(max(coalesce(extract(epoch FROM replay_lag), 0)), 0)
    FROM pg_stat_replication
"""
# waitstart (PostgreSQL 14+) is when the session began waiting for the lock it lacks.
# The long waits are found first, so pg_blocking_pids (which takes the lock manager's
# locks for a moment) is called only for them; a chunk waiting on a chunk is cleanup's
# own contention, not a session cleanup keeps waiting. pg_locks and pg_stat_activity
# cover the whole server: only this database's sessions count.
_LOCK_WAITS = """
    WITH waiting AS MATERIALIZED (
        SELECT pid, extract(epoch FROM clock_timestamp() - waitstart) * 1000 AS waited_ms
        FROM pg_locks
        WHERE NOT granted AND pid <> pg_backend_pid()
          AND waitstart < clock_timestamp() - make_interval(secs => %s)
    )
    SELECT count(*), max(waiting.waited_ms)
    FROM waiting JOIN pg_stat_activity waiter ON waiter.pid = waiting.pid
    WHERE waiter.datname = current_database()
      AND waiter.application_name IS DISTINCT FROM %s
      AND EXISTS (SELECT FROM pg_stat_activity holder
                  WHERE holder.pid = ANY (pg_blocking_pids(waiting.pid))
                    AND holder.application_name = %s)
"""
# The progress view lists every database's vacuums: a relid is only unique within one.
_VACUUM = """
    SELECT progress.phase, activity.backend_type
    FROM pg_stat_progress_vacuum progress
    LEFT JOIN pg_stat_activity activity ON activity.pid = progress.pid
    WHERE progress.datid = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND progress.relid = to_regclass(quote_ident(%s))
"""


def replica_lag(policy: Policy, connection, *, limit: float = MAX_REPLICA_LAG) -> Signal:
    """Hold while the most lagging standby replays more than ``limit`` seconds behind."""
    standbys, lag = _fetch(connection, _REPLICA_LAG)
    lag = float(lag)
    if not standbys:
        return Signal(Level.OK, "replica_lag", None, limit, "no standby connected")
    over = lag > limit
    return Signal(Level.HALT if over else Level.OK, "replica_lag", lag, limit,
                  f"replica lag {lag:.1f} s {'>' if over else '<='} {limit:g} s "
                  f"({standbys} standby connection{'s' if standbys > 1 else ''})")


def lock_waits(policy: Policy, connection, *, limit_ms: float = MAX_LOCK_WAIT_MS) -> Signal:
    """Slow down while another session has waited over ``limit_ms`` on a chunk's lock."""
    sessions, longest = _fetch(connection, _LOCK_WAITS, [
        limit_ms / 1000, CHUNK_APPLICATION_NAME, CHUNK_APPLICATION_NAME])
    if not sessions:
        return Signal(Level.OK, "lock_waits", None, limit_ms,
                      f"no session waits over {limit_ms:g} ms on a chunk's lock")
    longest = float(longest)
    return Signal(Level.SLOW, "lock_waits", longest, limit_ms,
                  f"{sessions} session{'s' if sessions > 1 else ''} waiting on a chunk's "
                  f"lock, longest {longest:.0f} ms > {limit_ms:g} ms")


def vacuum(policy: Policy, connection, *, halt_on_vacuum: bool = False) -> Signal:
    """Slow down (or halt) while a vacuum, manual or automatic, works on the policy's table.

    VACUUM FULL rewrites the table under an exclusive lock instead (a chunk waits for it),
    and reports as a cluster, not here.
    """
    table = policy.model._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(_VACUUM, [table])
        running = cursor.fetchall()
    if not running:
        return Signal(Level.OK, "vacuum", 0.0, None, f"no vacuum on {table}")
    phases = ", ".join(f"{phase} ({'autovacuum' if kind == 'autovacuum worker' else 'manual'})"
                       for phase, kind in running)
    return Signal(Level.HALT if halt_on_vacuum else Level.SLOW, "vacuum",
                  float(len(running)), None,
                  f"vacuum of {table} running: {phases}")


# What a signal's texts may hold: its reason is a Halt's reason (64 characters), and
# both are stored in PostgreSQL text, which takes no NUL.
MAX_REASON = 64
MAX_DETAIL = 500


def validated(answer: Any, name: str) -> Signal:
    """The indicator's answer as a signal the engine can store and act on: a level of
    the enum (a plain 2 is HOLD), finite numbers, texts cleaned and bounded; anything
    else is a HOLD whose detail says what was wrong with it. A host's indicator is
    input the engine does not write."""
    if not isinstance(answer, Signal):
        return _wrong(name, f"returned {_shown(answer)}, not a Signal")
    level = answer.level
    if isinstance(level, bool) or not isinstance(level, int) or level not in set(Level):
        return _wrong(name, f"returned the level {_shown(level)}, not one of "
                            f"{', '.join(f'{item.name} ({item.value})' for item in Level)}")
    for field in ("value", "limit"):
        number = getattr(answer, field)
        if number is not None and (isinstance(number, bool) or not isinstance(number, int | float)
                                   or not math.isfinite(number)):
            return _wrong(name, f"returned the {field} {_shown(number)}, not a finite number")
    for field in ("reason", "detail"):
        if not isinstance(getattr(answer, field), str):
            return _wrong(name, f"returned the {field} {_shown(getattr(answer, field))}, "
                                "not text")
    reason = _cleaned(answer.reason, MAX_REASON) or name[:MAX_REASON]
    return Signal(Level(level), reason, answer.value, answer.limit,
                  _cleaned(answer.detail, MAX_DETAIL))


def _wrong(name: str, what: str) -> Signal:
    return Signal(Level.HALT, INDICATOR_ERROR, None, None, _cleaned(f"{name} {what}", MAX_DETAIL))


def _shown(value: Any) -> str:
    return _cleaned(repr(value), 80)


def _cleaned(text: str, limit: int) -> str:
    """Printable, on one line, at most ``limit`` characters."""
    text = "".join(c if c.isprintable() else " " for c in text).strip()
    return text if len(text) <= limit else text[:limit - 1] + "…"


def evaluate(policy: Policy, indicators: Iterable[Indicator], connection) -> Signal:
    """Return the worst of the indicators' signals; an indicator that raises, or whose
    answer is no valid signal, halts.

    Stops at the first halt, which nothing is worse than. With no indicators, OK.
    """
    worst: Signal | None = None
    for indicator in indicators:
        name = _name(indicator)
        started = time.monotonic()
        try:
            signal = validated(indicator(policy, connection), name)
            took = time.monotonic() - started
            if took > INDICATOR_SECONDS:
                signal = _wrong(name, f"took {took:.1f} s to answer, more than "
                                      f"{INDICATOR_SECONDS:g} s")
        except Exception as exc:
            log.warning("pressure indicator failed; halting", policy=policy.name,
                        indicator=name, error=repr(exc))
            signal = Signal(Level.HALT, INDICATOR_ERROR, None, None,
                            _cleaned(f"{name} failed: {type(exc).__name__}: {exc}", MAX_DETAIL))
        if worst is None or signal.level > worst.level:
            worst = signal
        if worst.level is Level.HALT:
            break
    return worst or Signal(Level.OK, "none", None, None, "no indicator")


_cache: dict[str, tuple[float, Signal]] = {}
_cache_lock = threading.Lock()


# Set while a chunk's transaction holds learners' rows: the host's indicators are not
# read then (a slow one would keep a learner's renewal waiting on the chunk's locks);
# their last reading, taken by the worker before the transaction, stands in. The
# engine's own indicators are catalog reads under the chunk's statement timeout, and
# the lock waits a chunk causes can only be seen while it holds its locks.
_host_readings_only: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "host_readings_only", default=False)
_host_readings: dict[str, Signal] = {}
NOT_READ = "not_read"


@contextmanager
def holding_rows() -> Iterator[None]:
    """Within the block, ``check`` reads no host indicator: their last reading, or a
    halt if there is none yet."""
    token = _host_readings_only.set(True)
    try:
        yield
    finally:
        _host_readings_only.reset(token)


def cached(policy_name: str, seconds: float, compute: Callable[[], Signal]) -> Signal:
    """Return the policy's signal computed less than ``seconds`` ago, or compute it now.

    Monotonic time, so a clock step neither expires nor freezes it. Two threads that
    both find it stale both compute; the later one is kept.
    """
    now = time.monotonic()
    with _cache_lock:
        entry = _cache.get(policy_name)
    if entry is not None and now - entry[0] < seconds:
        return entry[1]
    signal = compute()
    with _cache_lock:
        _cache[policy_name] = (time.monotonic(), signal)
    return signal


def forget(policy_name: str | None = None) -> None:
    """Drop one policy's cached signal, or every policy's."""
    with _cache_lock:
        if policy_name is None:
            _cache.clear()
            _host_readings.clear()
        else:
            _cache.pop(policy_name, None)
            _host_readings.pop(policy_name, None)


def _fetch(connection, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()


def _name(indicator: Indicator) -> str:
    """The indicator's function name, through a ``functools.partial`` too."""
    while not hasattr(indicator, "__name__") and hasattr(indicator, "func"):
        indicator = indicator.func
    return getattr(indicator, "__name__", type(indicator).__name__)


def check(policy: Policy) -> Signal:
    """The policy's signal now: the engine's three indicators with the settings' limits
    and the host's own (``CLEANUP_PRESSURE_INDICATORS``), reused for
    ``CLEANUP_PRESSURE_CHECK_SECONDS``.

    Read on Django's connection, each indicator in a savepoint of its own: planning runs
    in the transaction that ends a chunk, and a failed read must not take its outcome
    with it.
    """
    def compute() -> Signal:
        engine = [
            functools.partial(replica_lag, limit=float(conf.MAX_REPLICA_LAG)),
            functools.partial(lock_waits, limit_ms=float(conf.MAX_LOCK_WAIT_MS)),
            functools.partial(vacuum, halt_on_vacuum=policy.halt_on_vacuum),
        ]
        signal = evaluate(policy, [_in_savepoint(indicator) for indicator in engine],
                          connection)
        if signal.level is Level.HALT or not conf.PRESSURE_INDICATORS:
            return signal
        host = _host_reading(policy)
        return host if host.level > signal.level else signal

    return cached(policy.name, float(conf.PRESSURE_CHECK_SECONDS), compute)


def _host_reading(policy: Policy) -> Signal:
    """The host's indicators' worst signal: read now, or inside ``holding_rows`` the
    last reading (a halt until there is one)."""
    if _host_readings_only.get():
        return _host_readings.get(policy.name) or Signal(
            Level.HALT, NOT_READ, None, None,
            "the host's indicators are not read yet: they are read before a chunk's "
            "transaction, never while it holds learners' rows")
    signal = evaluate(policy, [_in_savepoint(_imported(path))
                               for path in conf.PRESSURE_INDICATORS], connection)
    _host_readings[policy.name] = signal
    return signal


def _imported(path: Any) -> Indicator:
    """The host's indicator at ``path``; one that cannot be imported (cleanup.E026
    names it) is an indicator that fails, so the policy halts and says why."""
    try:
        indicator = import_string(path)
        if callable(indicator):
            return indicator
        problem: BaseException = TypeError(f"{path!r} is not callable")
    except Exception as exc:  # noqa: BLE001 - a host's module may raise anything on import
        problem = exc

    def cannot_be_imported(policy, db):
        raise problem

    cannot_be_imported.__name__ = str(path)
    return cannot_be_imported


def _in_savepoint(indicator: Indicator) -> Indicator:
    @functools.wraps(indicator.func if isinstance(indicator, functools.partial) else indicator)
    def read(policy, db):
        with transaction.atomic():
            return indicator(policy, db)
    return read
