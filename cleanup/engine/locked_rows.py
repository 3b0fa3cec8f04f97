"""Rows another transaction keeps locked never stall a chunk.

A chunk's statement waits for learners' rows at most ``CLEANUP_ROW_LOCK_WAIT_MS``
(50 ms: a renewal commits in a few). Past it the worker applies the chunk again at once
with its statement narrowed by ``skipped``, which locks the rows it can and leaves the
others (``FOR UPDATE SKIP LOCKED``); what is still eligible afterwards is counted as
``rows_locked`` and left to a later run. Skipping is the fallback, not the rule: locking
each row first costs the statement 2.2-2.5 times as much (docs/operations.md).
"""

from __future__ import annotations

from django.db import connection

from cleanup.conf import conf
from cleanup.models import Run

# A lock wait that outlasted lock_timeout.
LOCK_NOT_AVAILABLE = "55P03"
# A chunk's run's state, with the bound of the lock waits that follow it.
_RUN_STATE_AND_LOCK_WAIT = ("SELECT state, set_config('lock_timeout', %s, true) "
                            f'FROM "{Run._meta.db_table}" WHERE id = %s')


def skipped(eligible):
    """The chunk's statement narrowed to the eligible rows no other transaction keeps
    locked, which it locks first (``FOR UPDATE SKIP LOCKED``): nothing waits for the
    others. The whole predicate stays in the statement's own WHERE, so a row renewed
    between the lock and the DELETE survives."""
    unlocked = eligible.select_for_update(skip_locked=True).order_by().values("pk")
    return eligible.filter(pk__in=unlocked)


def run_cancelled(run_id, *, row_lock_wait: bool) -> bool:
    """Whether the run was cancelled; in the same round trip, the lock waits of the
    rest of the transaction are bounded: by ``CLEANUP_ROW_LOCK_WAIT_MS`` where the
    chunk's statement may wait for learners' rows (kept locked longer, they are
    skipped), else by the lock timeout as before."""
    wait = min(conf.ROW_LOCK_WAIT_MS, conf.LOCK_TIMEOUT_MS) if row_lock_wait else (
        conf.LOCK_TIMEOUT_MS)
    with connection.cursor() as cursor:
        cursor.execute(_RUN_STATE_AND_LOCK_WAIT, [f"{wait}ms", run_id])
        row = cursor.fetchone()
    return row is not None and row[0] == Run.State.CANCELLED


def wait_ran_out(exc: BaseException) -> bool:
    return getattr(exc.__cause__, "sqlstate", None) == LOCK_NOT_AVAILABLE
