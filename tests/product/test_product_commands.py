"""The product's own commands: seed_reservations and send_reminders."""

from __future__ import annotations

import re
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from reservations.models import Reminder, ReminderAttempt, SeatHold
from tests.commands.test_commands import run_json

pytestmark = pytest.mark.django_db


def test_seed_reservations_creates_the_requested_rows(db):
    out = StringIO()
    call_command("seed_reservations", "--tenants", "2", "--expired", "30", "--active", "20",
                 "--confirmed", "5", "--reminder-attempts", "10", "--seed", "7", stdout=out)
    now = timezone.now()
    holds = SeatHold.objects
    assert holds.filter(status="held", expires_at__lte=now).count() == 30
    assert holds.filter(status="held", expires_at__gt=now).count() == 20
    assert holds.filter(status="confirmed").count() == 5
    assert ReminderAttempt.objects.count() == 10
    # Each held hold has its pending reminder, due the lead before the hold expires.
    lead = timedelta(minutes=5)
    reminders = Reminder.objects.filter(state="pending")
    assert sorted(reminders.values_list("hold_id", flat=True)) == sorted(
        holds.filter(status="held").values_list("pk", flat=True))
    assert all(r.due_at == SeatHold.objects.get(pk=r.hold_id).expires_at - lead
               for r in reminders)
    assert "50 pending reminders, 10 reminder attempts" in out.getvalue()


def test_seed_reservations_takes_the_old_spelling_of_reminder_attempts(db):
    call_command("seed_reservations", "--tenants", "1", "--expired", "1", "--active", "0",
                 "--reminders", "3", stdout=StringIO())
    assert ReminderAttempt.objects.count() == 3


@pytest.mark.parametrize("option, value, error", [
    ("--tenants", "0", "argument --tenants: expected a whole number from 1 to 100,000, not '0'"),
    ("--expired", "-1", "argument --expired: expected a whole number from 0 to 100,000,000"),
    ("--active", "1e3", "argument --active: expected a whole number from 0 to 100,000,000"),
    ("--confirmed", "999999999999", "from 0 to 100,000,000, not '999999999999'"),
    ("--seed", "²", "argument --seed: expected a whole number from 0 to 2,147,483,647"),
])
def test_seed_reservations_refuses_bad_counts(db, option, value, error):
    counts = {"--tenants": "1", "--expired": "1", "--active": "1", option: value}
    with pytest.raises(CommandError, match=re.escape(error)):
        call_command("seed_reservations", *[x for pair in counts.items() for x in pair])
    assert SeatHold.objects.count() == 0


def test_send_reminders_sends_the_ready_ones_and_says_why_others_were_not(section):
    from django.core import mail

    from reservations.services import hold_seat

    sent = hold_seat(section.pk, "due", now=timezone.now() - timedelta(minutes=11))
    confirmed = hold_seat(section.pk, "confirmed", now=timezone.now() - timedelta(minutes=11))
    Reminder.objects.filter(hold_id__in=[sent.pk, confirmed.pk]).update(state="ready")
    # Confirmed after it was marked, bypassing the service (which would cancel the
    # reminder), as a race would: the sender finds the hold confirmed and skips it.
    SeatHold.objects.filter(pk=confirmed.pk).update(status="confirmed")
    result = run_json("send_reminders")
    assert result == {"sent": 1, "not_sent": {"confirmed": 1}}
    assert [m.to for m in mail.outbox] == [["due@learners.example.edu"]]
    out = StringIO()
    call_command("send_reminders", stdout=out)
    assert out.getvalue().strip() == "Sent 0 reminders."
    with pytest.raises(CommandError, match="--batch must be at least 1"):
        call_command("send_reminders", "--batch", "0")
