"""Steps that give up on a lock rather than wait it out, and say who held it.

A step is a unit of the engine's work that a scheduler or an operator starts: a
policy's dispatch, the reconciler, the publisher, the pressure's recheck, a host's
scheduled task. Its statements run ``lock_bounded`` (cleanup.bounds): a lock held past
``CLEANUP_LOCK_TIMEOUT_MS`` cancels the statement, its transaction rolls back, and the
step gives up with ``StepBlocked``. It is tried again at its next turn (the next
schedule slot, the next minute's task, the operator's next command).

Each give-up is recorded where an operator looks (a ``BlockedStep`` row: the overview's
banner, ``cleanup_status``, the gauge ``cleanup_step_blocked_seconds`` and the alert
``CleanupStepBlocked``), with the session found holding a table lock that blocks reads
or writes, as pg_stat_activity shows it: its application, pid and query. The row is
kept, its first give-up kept as ``since``, until the step next gets through.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import structlog
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models import DurationField, ExpressionWrapper, F
from django.db.models.functions import Now

from cleanup.bounds import is_lock_timeout, lock_bounded
from cleanup.conf import conf
from cleanup.exceptions import CleanupError, cause_of
from cleanup.models import BlockedStep

log = structlog.get_logger("cleanup.steps")

QUERY_KEPT = 200  # characters of the blocking session's query kept
_in_step: ContextVar[bool] = ContextVar("cleanup_in_step", default=False)

# The session holding, in this database, a table lock that keeps reads or writes
# waiting (SHARE or stronger: what a LOCK TABLE, a migration's ALTER, a REFRESH or a
# CREATE INDEX take), the longest-held first. pg_locks never waits.
_HOLDER = """
    SELECT activity.pid, activity.application_name, lock.mode,
           lock.relation::regclass::text, left(activity.query, %s)
    FROM pg_locks lock
    JOIN pg_stat_activity activity ON activity.pid = lock.pid
    WHERE lock.locktype = 'relation' AND lock.granted
      AND lock.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND lock.mode IN ('ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock',
                        'AccessExclusiveLock')
      AND lock.pid <> pg_backend_pid()
    ORDER BY activity.xact_start NULLS LAST, activity.pid
    LIMIT 1
"""


class StepBlocked(CleanupError):
    """A step gave up on a lock at its bound; nothing it did stayed."""

    def __init__(self, blocked: BlockedStep | None, step: str, policy: str):
        self.blocked = blocked
        what = f"{step} of {policy}" if policy else step
        held = f" held by {blocked.blocker}" if blocked and blocked.blocker_pid else ""
        lock = f": {blocked.blocker_lock}" if blocked and blocked.blocker_lock else ""
        super().__init__(
            f"{what} gave up after waiting {conf.LOCK_TIMEOUT_MS} ms for a lock{held}{lock}; "
            "nothing was changed, and it is tried again at its next turn")


@contextmanager
def step(name: str, policy: str = "") -> Iterator[None]:
    """Run the block as the step ``name`` (of ``policy``): every statement bounded; a
    lock wait past the bound recorded and raised as ``StepBlocked``; getting through
    clears what an earlier give-up recorded."""
    if _in_step.get():
        yield  # a step within a step (a scheduled dispatch's): the outer one records
        return
    entered = _in_step.set(True)
    try:
        with lock_bounded():
            yield
    except DatabaseError as exc:
        if not is_lock_timeout(exc) or connection.in_atomic_block:
            raise  # a caller's transaction is aborted: it records nothing here
        raise StepBlocked(_record(name, policy), name, policy) from exc
    finally:
        _in_step.reset(entered)
    _clear(name, policy)


def _record(name: str, policy: str) -> BlockedStep | None:
    """Record the give-up with the session found holding the lock; None if even that
    could not be written (logged: the step's own error still says what happened)."""
    try:
        with lock_bounded(), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(_HOLDER, [QUERY_KEPT])
            holder = cursor.fetchone()
            pid, application, mode, relation, query = holder or (None, "", "", "", "")
            found = {"last_at": Now(), "blocker_pid": pid,
                     "blocker_application": application or "",
                     "blocker_lock": f"{mode} on {relation}" if holder else "",
                     "blocker_query": (query or "").strip()}
            _upsert(name, policy, found)
            recorded = BlockedStep.objects.get(step=name, policy=policy)
    except DatabaseError as exc:
        log.warning("blocked step not recorded", step=name, policy=policy,
                    error=cause_of(str(exc)))
        return None
    log.warning("step gave up on a lock", step=name, policy=policy, times=recorded.times,
                blocker=recorded.blocker, lock=recorded.blocker_lock)
    return recorded


def _upsert(name: str, policy: str, found: dict) -> None:
    """Count one more give-up of the step, or record its first."""
    again = {"times": F("times") + 1, **found}
    if BlockedStep.objects.filter(step=name, policy=policy).update(**again):
        return
    try:
        with transaction.atomic():
            BlockedStep.objects.create(step=name, policy=policy, since=Now(), **found)
    except IntegrityError:  # another process's give-up, recorded a moment ago
        BlockedStep.objects.filter(step=name, policy=policy).update(**again)


def _clear(name: str, policy: str) -> None:
    """The step got through: what blocked it before is over. One statement, skipped
    by the database when nothing was recorded."""
    try:
        with lock_bounded():
            BlockedStep.objects.filter(step=name, policy=policy).delete()
    except DatabaseError as exc:
        log.warning("blocked step not cleared", step=name, policy=policy,
                    error=cause_of(str(exc)))


def blocked_now() -> list[BlockedStep]:
    """Every step that gave up on a lock and has not got through since, with ``age``:
    the database's now() minus its first give-up. One statement."""
    age = ExpressionWrapper(Now() - F("since"), output_field=DurationField())
    return list(BlockedStep.objects.annotate(age=age).order_by("since"))
