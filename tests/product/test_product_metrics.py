"""The product's own series on /metrics (reservations/metrics.py): the reminder backlog,
and the alert rules and dashboard that read it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from cleanup.engine.dispatch import dispatch_in_process
from reservations.reminders import send_ready_reminders
from reservations.services import hold_seat
from tests.observability.test_metrics import families_served, scrape, series_deployed, value

pytestmark = pytest.mark.django_db


def test_each_metric_is_declared_once_and_alerts_use_only_real_series(client):
    families = families_served(client, "reservations")
    assert len(families) == len(set(families))
    names = {n for (n, _) in scrape(client)} | set(families)
    used = series_deployed("reservations")
    assert "reservations_reminders_oldest_due_unsent_age_seconds" in used
    assert used - names == set()


def test_the_reminder_backlog_shows_due_unsent_reminders_by_state_and_age(client, section):
    # Holds made 12 minutes ago expire in 3 minutes: their reminders fell due 2 minutes ago.
    for n in range(2):
        hold_seat(section.pk, f"learner-{n}", now=timezone.now() - timedelta(minutes=12))
    hold_seat(section.pk, "not-due-yet")
    samples = scrape(client)
    pending, ready = {"state": "pending"}, {"state": "ready"}
    assert value(samples, "reservations_reminders_due_unsent", **pending) == 2
    assert value(samples, "reservations_reminders_due_unsent", **ready) == 0
    age = value(samples, "reservations_reminders_oldest_due_unsent_age_seconds", **pending)
    assert 120 <= age < 150
    # Minutely marking and sending, plus the 120-second scheduler grace.
    assert value(samples, "reservations_reminder_late_limit_seconds") == 240

    dispatch_in_process("mark-reminders-ready")
    samples = scrape(client)
    assert value(samples, "reservations_reminders_due_unsent", **pending) == 0
    assert value(samples, "reservations_reminders_due_unsent", **ready) == 2
    assert value(samples, "reservations_reminders_oldest_due_unsent_age_seconds",
                 **ready) >= 120

    assert send_ready_reminders() == {"sent": 2}
    samples = scrape(client)
    assert value(samples, "reservations_reminders_due_unsent", **ready) == 0
    assert value(samples, "reservations_reminders_oldest_due_unsent_age_seconds", **ready) == 0
