"""Every statement of a step waits for a lock at most ``CLEANUP_LOCK_TIMEOUT_MS``.

A step (a dispatch, the reconciler, the publisher, a metrics scrape, a host's task)
runs inside ``lock_bounded()``. There each statement runs with PostgreSQL's
``lock_timeout`` set for its transaction: a statement in a transaction of its own
(autocommit) gets one, begun with the bound; in a caller's transaction the bound is
set before its first statement, once. Never on the session: a transaction pooler
(PgBouncer) hands a server connection, with whatever a session set left on it, to
another client, and gives the next statement another connection without it.

A lock held past the bound (a table locked ACCESS EXCLUSIVE by a report, a migration
waiting) then cancels the statement with SQLSTATE 55P03, which ``is_lock_timeout``
recognizes; the step gives up rather than wait it out (cleanup.engine.steps records
why and who holds the lock).

The chunk's own path bounds its transaction in the ledger's functions
(cleanup/sql/delivery_v1.sql) and does not run here: its round trips are counted.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection, transaction

from cleanup.conf import conf

LOCK_TIMEOUT = "55P03"  # lock_not_available: lock_timeout, or NOWAIT
_SET = "SELECT set_config('lock_timeout', %s, true)"


def _bound_marker() -> None:
    """Registered with on_commit in each transaction the bound was set in: Django
    drops it at the transaction's end and at a rollback to a savepoint it was set
    after, exactly as PostgreSQL drops a SET LOCAL."""


class _LockBound:
    def __init__(self, lock_ms: int):
        self.setting = f"{lock_ms}ms"

    def __call__(self, execute, sql, params, many, context):
        db = context["connection"]
        if db.in_atomic_block:
            if not any(entry[1] is _bound_marker for entry in db.run_on_commit):
                self._set(db, context["cursor"])
            return execute(sql, params, many, context)
        with transaction.atomic(using=db.alias):
            self._set(db, context["cursor"])
            return execute(sql, params, many, context)

    def _set(self, db, cursor) -> None:
        # The driver's own cursor: Django's would run this through the wrappers again.
        cursor.cursor.execute(_SET, [self.setting])
        transaction.on_commit(_bound_marker, using=db.alias)


@contextmanager
def lock_bounded(lock_ms: int | None = None) -> Iterator[None]:
    """Bound every statement sent on the default connection meanwhile: a lock is waited
    for at most ``lock_ms`` (default ``CLEANUP_LOCK_TIMEOUT_MS``)."""
    bound = _LockBound(conf.LOCK_TIMEOUT_MS if lock_ms is None else lock_ms)
    with connection.execute_wrapper(bound):
        yield


def is_lock_timeout(exc: BaseException) -> bool:
    """Whether a Django database error is a lock wait given up at its bound."""
    return getattr(exc.__cause__, "sqlstate", None) == LOCK_TIMEOUT
