"""Every write of an outbox event, and of the totals counted as events settle: one
function per change, those a stale caller could repeat guarded by the state they leave.
Nothing else writes ``cleanup_event`` (tests/project/test_architecture.py) but the retention
purge, a policy's DELETE (cleanup.retention); a trigger's events come from the same
INSERT as ``emit()``'s (``insert_per_row``).

    emit, a trigger ──▶ pending ──deliver──▶ delivered
                         │   ▲
             dead_letter │   │ requeue
                         ▼   │
                         dead ──discard──▶ discarded

A failed attempt leaves the event pending, not taken before its back-off.

Delivered and discarded events are counted in the totals (cleanup.models.Total, one
row per event name) by the statement that settles them, so /metrics reads a few rows
however many events the outbox keeps, and the purge deletes events without touching
the totals. Each count is the last statement before its transaction commits, so the
total's row lock is held for the commit alone: publishers delivering events of one
name at once queue for a millisecond there, never for a handler's time.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from django.db import connections, router
from django.db.models.functions import Now

from cleanup.models import Event

# A new event: the values its writer gives, as SQL (emit's placeholders, or a trigger's
# expressions over its rows), then what every new event starts with.
INSERT = """
INSERT INTO cleanup_event (name, "key", ordering_key, payload, source, run_id, chunk_id,
                           state, attempts, available_at, created_at, last_error, cause,
                           reason)
SELECT {name}, {key}, {ordering_key}, {payload}, {source}, {run_id}, {chunk_id},
       'pending', 0, now(), now(), '', '', ''
{rows}
ON CONFLICT (name, "key") DO NOTHING"""

EMIT = INSERT.format(name="%s", key="%s", ordering_key="%s", payload="%s::jsonb",
                     source="%s", run_id="%s", chunk_id="%s", rows="") + "\nRETURNING id"

# The record of a call, written before its handler runs: when it began (the database's
# clock unless a time is given), and no other publisher takes the event before the
# back-off this call would earn by failing. One statement, returning what it wrote.
BEGIN_CALL = """
UPDATE cleanup_event
SET call_started_at = coalesce(%(now)s, clock_timestamp()),
    available_at = coalesce(%(now)s, clock_timestamp()) + %(backoff)s
WHERE id = %(id)s
RETURNING call_started_at, available_at
"""

# Mark one event delivered and count it, in one statement: 1 row if it was pending.
DELIVER = """
WITH delivered AS (
    UPDATE cleanup_event
    SET state = 'delivered', delivered_at = now(), settled_at = now(), call_started_at = NULL
    WHERE id = %s AND state = 'pending'
    RETURNING name
)
SELECT cleanup_total_add_v1('event', name, '{"delivered": 1}') FROM delivered
"""

# Count events just settled in ``state``, per name (in name order: concurrent counts
# take the totals' row locks in one order).
COUNT_SETTLED = """
SELECT cleanup_total_add_v1('event', name, jsonb_build_object(%s::text, count(*)))
FROM cleanup_event WHERE id = ANY(%s) GROUP BY name ORDER BY name
"""

PENDING, DEAD = Event.State.PENDING, Event.State.DEAD


def insert(name: str, key: str, ordering_key: str, payload: str, source: str,
           run_id: str | None, chunk_id: int | None) -> bool:
    """A new pending event (``payload`` its JSON text), every value checked already
    (emit); False if ``(name, key)`` exists."""
    with _cursor() as cursor:
        cursor.execute(EMIT, [name, key, ordering_key, payload, source, run_id, chunk_id])
        return cursor.fetchone() is not None


def insert_per_row(rows: str, when: str, **values: str) -> str:
    """The INSERT of one new pending event per row of ``rows`` for which ``when`` holds,
    each value an expression over that row: SQL for a trigger's body (triggers.py)."""
    # Ordered by ordering key, then key (the SELECT's 3rd and 2nd values), for every
    # statement: concurrent inserts take their index locks in one order, never deadlock.
    return INSERT.format(rows=f"FROM {rows}\nWHERE {when}\nORDER BY 3, 2", **values)


def begin_call(pk: int, now: datetime | None, backoff: timedelta) -> tuple[datetime, datetime]:
    """A handler's call recorded before it runs: (call_started_at, available_at)."""
    with _cursor() as cursor:
        cursor.execute(BEGIN_CALL, {"id": pk, "now": now, "backoff": backoff})
        return cursor.fetchone()


def count_lost_call(event: Event, cause: str) -> None:
    """An earlier call of the (locked) event never returned: a failed attempt."""
    Event.objects.filter(pk=event.pk).update(attempts=event.attempts + 1, cause=cause,
                                             last_error=cause)


def to_delivered(pk: int) -> bool:
    """pending → delivered, counted in the same statement; False if it was not pending."""
    with _cursor() as cursor:
        cursor.execute(DELIVER, [pk])
        return cursor.rowcount == 1


def to_retrying(event: Event, cause: str, error: str, available_at: datetime) -> None:
    """A failed attempt of the (locked, pending) event, which stays pending, taken again
    at ``available_at`` (the console's "retrying")."""
    _attempt_failed(event, cause, error, available_at=available_at, call_started_at=None)


def to_dead(event: Event, cause: str, error: str) -> None:
    """pending → dead, with the attempt that made it so."""
    _attempt_failed(event, cause, error, state=DEAD, settled_at=Now(), call_started_at=None)


def dead_to_pending(pks: Sequence[int]) -> None:
    """dead → pending, available now, attempts kept (requeued by an operator)."""
    Event.objects.filter(pk__in=pks, state=DEAD).update(state=PENDING, available_at=Now(),
                                                        settled_at=None)


def dead_to_discarded(pks: Sequence[int], reason: str) -> None:
    """dead → discarded, with the operator's reason, and counted: ``pks`` are dead events
    the caller holds locked, so each is discarded, and counted, once."""
    Event.objects.filter(pk__in=pks, state=DEAD).update(
        state=Event.State.DISCARDED, reason=reason, settled_at=Now())
    if pks:
        with _cursor() as cursor:
            cursor.execute(COUNT_SETTLED, [Event.State.DISCARDED, list(pks)])


def _attempt_failed(event: Event, cause: str, error: str, **changes) -> None:
    """Count a failed attempt of the event, guarded: still pending, its attempts as read."""
    Event.objects.filter(pk=event.pk, state=PENDING, attempts=event.attempts).update(
        attempts=event.attempts + 1, cause=cause, last_error=error, **changes)


def _cursor():
    return connections[router.db_for_write(Event)].cursor()
