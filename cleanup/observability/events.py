"""The outbox on /metrics: events waiting per name, and how long the oldest has waited.

Both are read through the partial index of pending events (``event_pending_by_key``
and ``event_pending_unordered``), a few rows however many events were delivered: a
scrape never counts the delivered ones. Their totals will come through a fold, as the
chunks' do, once a policy purges delivered events.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Count, Min
from prometheus_client.core import GaugeMetricFamily

from cleanup.models import Event


def event_families(now: datetime):
    """The outbox's gauges at ``now``."""
    pending = GaugeMetricFamily(
        "cleanup_events_pending",
        "Events written and not yet delivered (nor dead), by event name.",
        labels=["name"])
    oldest = GaugeMetricFamily(
        "cleanup_events_oldest_pending_age_seconds",
        "Seconds the oldest event not yet delivered (nor dead) has waited since it was "
        "written; 0 when none waits.")
    rows = (Event.objects.filter(state=Event.State.PENDING).order_by()
            .values("name").annotate(events=Count("pk"), since=Min("created_at")))
    since = None
    for row in rows:
        pending.add_metric([row["name"]], row["events"])
        since = row["since"] if since is None else min(since, row["since"])
    oldest.add_metric([], max((now - since).total_seconds(), 0.0) if since else 0.0)
    yield pending
    yield oldest
