"""How many events of each name were delivered or discarded, counted in the transaction
that settles them: /metrics reads a few rows of EventTotal however many events the
outbox keeps, and the retention purge deletes events without touching the totals.

Each count is the last statement before its transaction commits, so the total's row
lock (one row per name and state) is held for the commit alone: publishers delivering
events of one name at once queue for a millisecond there, never for a handler's time.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connections, router

from cleanup.models import Event

# Mark one event delivered and count it, in one statement: 1 row if it was pending.
DELIVER = """
WITH delivered AS (
    UPDATE cleanup_event
    SET state = 'delivered', delivered_at = now(), settled_at = now(), call_started_at = NULL
    WHERE id = %s AND state = 'pending'
    RETURNING name
)
INSERT INTO cleanup_eventtotal (name, state, value)
SELECT name, 'delivered', 1 FROM delivered
ON CONFLICT (name, state) DO UPDATE SET value = cleanup_eventtotal.value + 1
"""

# Count events just settled in ``state``, per name.
COUNT_SETTLED = """
INSERT INTO cleanup_eventtotal (name, state, value)
SELECT name, %s, count(*) FROM cleanup_event WHERE id = ANY(%s) GROUP BY name
ON CONFLICT (name, state) DO UPDATE SET value = cleanup_eventtotal.value + excluded.value
"""


def deliver(pk: int) -> bool:
    """Mark the (locked) event delivered and count it; False if it was not pending."""
    with connections[router.db_for_write(Event)].cursor() as cursor:
        cursor.execute(DELIVER, [pk])
        return cursor.rowcount == 1


def count_settled(ids: Sequence[int], state: str) -> None:
    """Count ``ids``, settled in ``state`` by the current transaction, in EventTotal."""
    if ids:
        with connections[router.db_for_write(Event)].cursor() as cursor:
            cursor.execute(COUNT_SETTLED, [state, list(ids)])
