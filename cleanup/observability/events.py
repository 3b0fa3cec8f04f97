"""The outbox on /metrics: events waiting per name, how long the oldest has waited,
and how many were delivered, discarded or are dead.

The waiting ones are read through the partial index of pending events
(``event_pending_by_key`` and ``event_pending_unordered``), the dead ones through
``event_dead``, and the totals are each event name's row of cleanup.models.Total,
counted as each event settled (cleanup.outbox.events): a scrape never counts the
delivered events the outbox keeps for ``CLEANUP_EVENT_RETENTION_DAYS``. Each read is
bounded like the backlogs' (``Budget``): past it the figures are left out of the
scrape, unknown, never 0.
"""

from __future__ import annotations

from datetime import datetime

from django.db import connections, router
from django.db.models import Count, Min
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from cleanup.models import Event
from cleanup.observability.backlog import Backlog, Budget, kept, remember

# Per name, the totals delivered and discarded, and the dead events (through the
# partial index event_dead): a few rows however many events are kept. A total edited
# by hand into something that is not a whole number is left out.
SETTLED = """
SELECT total.subject, figure.key, trunc(figure.value::text::numeric)::bigint
FROM cleanup_total AS total,
     jsonb_each(CASE WHEN jsonb_typeof(total.figures) = 'object' THEN total.figures
                ELSE '{}' END) AS figure
WHERE total.family = 'event' AND figure.key IN ('delivered', 'discarded')
  AND jsonb_typeof(figure.value) = 'number' AND abs(figure.value::text::numeric) < 9e18
UNION ALL
SELECT name, 'dead', count(*) FROM cleanup_event WHERE state = 'dead' GROUP BY name
ORDER BY 1, 2
"""


# The last exact reading of the oldest pending event, kept in the database for every
# process (cleanup.observability.backlog): when a reading runs out of its budget the age
# goes on from it, so a stuck outbox keeps its alert (an age read as nothing would
# silence it on the very day the table is locked).
KEY = "events:pending"


def event_families(now: datetime):
    """The outbox's figures at ``now``, each read within the scrape's budget."""
    budget = Budget()
    pending = GaugeMetricFamily(
        "cleanup_events_pending",
        "Events written and not yet delivered (nor dead), by event name. No sample while "
        "they cannot be counted.",
        labels=["name"])
    oldest = GaugeMetricFamily(
        "cleanup_events_oldest_pending_age_seconds",
        "Seconds the oldest event not yet delivered (nor dead) has waited since it was "
        "written; 0 when none waits. Past the budget, aged from the last reading any "
        "process took; no sample if there is none.")
    measured = GaugeMetricFamily(
        "cleanup_events_measured",
        "1 when the outbox's figures were read now; 0 when reading them ran out of the "
        "budget (a lock on the table, say): the pending counts and totals then have no "
        "sample and the oldest age goes on from the last reading.")
    rows = budget.read(_pending)
    if rows is not None:
        for name, events, _ in rows:
            pending.add_metric([name], events)
        since = min((since for _, _, since in rows), default=None)
        remember(Backlog(sum(events for _, events, _ in rows), since), KEY, budget)
        oldest.add_metric([], max((now - since).total_seconds(), 0.0) if since else 0.0)
    elif (last := kept(KEY, budget)) and last.oldest_observed:  # at least this old
        oldest.add_metric([], max((now - last.oldest_observed).total_seconds(), 0.0))
    settled = budget.read(_settled) if rows is not None else None
    measured.add_metric([], 1 if settled is not None else 0)
    yield pending
    yield oldest
    yield measured
    yield from settled_families(settled or [])


def _pending() -> list[tuple[str, int, datetime]]:
    return [(row["name"], row["events"], row["since"]) for row in (
        Event.objects.filter(state=Event.State.PENDING).order_by()
        .values("name").annotate(events=Count("pk"), since=Min("created_at")))]


def settled_families(rows: list[tuple[str, str, int]]):
    """Delivered and discarded totals and dead events per name, from ``SETTLED``."""
    delivered = CounterMetricFamily(
        "cleanup_events_delivered", "Events delivered to their handler, by event name.",
        labels=["name"])
    discarded = CounterMetricFamily(
        "cleanup_events_discarded", "Dead events an operator discarded, by event name.",
        labels=["name"])
    dead = GaugeMetricFamily(
        "cleanup_events_dead",
        "Events dead-lettered and waiting for an operator (requeue or discard), by name.",
        labels=["name"])
    families = {"delivered": delivered, "discarded": discarded, "dead": dead}
    for name, state, events in rows:
        if state in families:  # a total edited by hand into another state is left out
            families[state].add_metric([name], events)
    yield from families.values()


def _settled() -> list[tuple[str, str, int]]:
    with connections[router.db_for_write(Event)].cursor() as cursor:
        cursor.execute(SETTLED)
        return cursor.fetchall()
