"""The lease of a run applied by its dispatching process (``--sync``): a PostgreSQL
session-level advisory lock that process holds on the run.

The database releases a session's locks the moment its connection ends, so a process
that dies (SIGKILL, OOM, a lost host) gives its runs up at once, without a heartbeat or
a clock: any other session sees the lock gone in ``pg_locks`` and hands the run to the
queue (``cleanup.engine.window.take_over_abandoned``). The lock is taken before the run's row
commits, so no session ever sees an in-process run that nobody holds while its process
lives. It needs a session of its own for the whole run: a pooler in transaction mode
(PgBouncer's) cannot keep it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import structlog
from django.db import connection

log = structlog.get_logger("cleanup.process_lock")

# pg_locks shows a bigint advisory key as two unsigned halves, with objsubid 1.
_HELD = """
    SELECT classid::bigint, objid::bigint FROM pg_locks
    WHERE locktype = 'advisory' AND objsubid = 1 AND granted
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""
_MINE = f"{_HELD} AND pid = pg_backend_pid() AND classid::bigint = %s AND objid::bigint = %s"

# The runs whose lease this process took on its connection (Django's, one per thread:
# --sync applies in the main thread).
_leased: set[str] = set()


def key(run_id) -> int:
    """The run's advisory lock key: 64 bits of its random id."""
    return int.from_bytes(uuid.UUID(str(run_id)).bytes[:8], "big", signed=True)


def _halves(run_id) -> tuple[int, int]:
    unsigned = key(run_id) & 0xFFFF_FFFF_FFFF_FFFF
    return unsigned >> 32, unsigned & 0xFFFF_FFFF


def acquire(run_id) -> bool:
    """Take the run's lease for this session unless another session holds it."""
    if held_here(run_id):
        return True  # not twice: one release must give it up
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [key(run_id)])
        taken = cursor.fetchone()[0]
    if taken:
        _leased.add(str(run_id))
    return taken


def release(run_id) -> None:
    """Give the run's lease up, if this session still holds it (a connection that
    was closed and reopened meanwhile has lost it already)."""
    _leased.discard(str(run_id))
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT pg_advisory_unlock(%s) WHERE EXISTS ({_MINE})",
                       [key(run_id), *_halves(run_id)])


@contextmanager
def holding(run_id) -> Iterator[None]:
    """Hold a new run's lease for the block (its id is fresh: nobody else can hold it)."""
    if not acquire(run_id):
        raise RuntimeError(f"the lease of run {run_id} is held by another session")
    try:
        yield
    finally:
        try:
            release(run_id)
        except Exception as exc:  # noqa: BLE001 - a lost connection has released it
            log.warning("releasing a run's lease failed", run_id=str(run_id), error=str(exc))


def absent_in_transaction(run_id) -> bool:
    """Whether no other session holds the run's lease, proven for the rest of the
    caller's transaction: a transaction-level lock on the same key, which also keeps
    the owner from taking its lease back until this transaction ends (then it finds
    the run taken over). Reading pg_locks alone would leave that gap open."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [key(run_id)])
        return cursor.fetchone()[0]


def leased_here() -> bool:
    """Whether this process holds the lease of a run it applies on this connection."""
    return bool(_leased)


def held_here(run_id) -> bool:
    """Whether this session holds the run's lease."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT EXISTS ({_MINE})", _halves(run_id))
        return cursor.fetchone()[0]


def held(run_ids: Iterable) -> set:
    """The runs among ``run_ids`` whose lease some live session holds (this one too)."""
    by_halves = {_halves(run_id): run_id for run_id in run_ids}
    if not by_halves:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(_HELD)
        return {by_halves[row] for row in map(tuple, cursor.fetchall()) if row in by_halves}
