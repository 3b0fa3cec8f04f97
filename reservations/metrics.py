"""The reminders' business backlog on /metrics: reminders due and not sent yet, and the
ones that failed.

A pending one waits for mark-reminders-ready, a ready one for the sender, a sending one
for its send to end (or for its claim to be taken over). Any is late once older than
the two schedules' periods plus the scheduler's grace: then a learner may see the hold
expire before the reminder arrives. A failed one will not be sent (until a renewal).
"""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily

from cleanup import schedule_period
from cleanup.host import COUNT_CAP, Budget, read_backlog
from cleanup.host import conf as cleanup_conf
from reservations.conf import conf
from reservations.models import Reminder

UNSENT = (Reminder.State.PENDING, Reminder.State.READY, Reminder.State.SENDING)


def late_limit(now) -> timedelta:
    """How long after its due time a reminder may still be unsent."""
    return (schedule_period(conf.MARK_READY_SCHEDULE, now)
            + schedule_period(conf.REMINDER_SEND_SCHEDULE, now)
            + timedelta(seconds=cleanup_conf.SCHEDULE_GRACE_SECONDS))


class ReminderCollector:
    """A prometheus_client collector over the reminders table."""

    def describe(self):
        return list(self._families())

    def collect(self):
        now = timezone.now()
        count, oldest, limit, failed = self._families()
        # Bounded like the engine's backlog: an expire-holds run deletes these rows
        # too, and reading past them in the index took 2.6 s per scrape. Counts stop
        # at the engine's cap, meaning "at least this many" there (100,000 took 130 ms).
        budget = Budget()
        for state in UNSENT:
            due = read_backlog(Reminder.objects.filter(state=state, due_at__lte=now),
                               "due_at", budget, cap=COUNT_CAP, key=f"reminders:{state}")
            if not due.measured:
                continue  # nothing read within the budget yet: no sample, never a 0
            count.add_metric([state], due.rows)
            first = due.oldest_observed
            oldest.add_metric([state], (now - first).total_seconds() if first else 0.0)
        limit.add_metric([], late_limit(now).total_seconds())
        for reason in Reminder.Failure.values:
            failed.add_metric([reason], Reminder.objects.filter(
                state=Reminder.State.FAILED, failure=reason)[:COUNT_CAP].count())
        yield from (count, oldest, limit, failed)

    def _families(self):
        return (
            GaugeMetricFamily(
                "reservations_reminders_due_unsent",
                f"Reminders past their due time and not sent, by state (counted up to "
                f"{COUNT_CAP}).", labels=["state"]),
            GaugeMetricFamily(
                "reservations_reminders_oldest_due_unsent_age_seconds",
                "How long the oldest unsent reminder in each state has been due (0 when "
                "none).", labels=["state"]),
            GaugeMetricFamily(
                "reservations_reminder_late_limit_seconds",
                "Due-unsent age past which a reminder is late: the marking and sending "
                "schedules' periods plus CLEANUP_SCHEDULE_GRACE_SECONDS."),
            GaugeMetricFamily(
                "reservations_reminders_failed",
                f"Reminders the sender marked failed, by reason: refused (a permanent SMTP "
                f"refusal), bad_address, gave_up (out of attempts); counted up to "
                f"{COUNT_CAP}.", labels=["reason"]),
        )


_collector = ReminderCollector()


def register_collector() -> None:
    """Add the reminder collector to prometheus_client's default registry, once."""
    from prometheus_client import REGISTRY

    if _collector not in REGISTRY._collector_to_names:
        REGISTRY.register(_collector)
