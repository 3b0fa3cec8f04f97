"""The product's own admin lists (seat holds, reminders, attempts, sections, tenants) in
the console's manner: filters and search, badges (unknown states too), counts with
separators, and a fit on a 1366 px laptop as the console's own lists have
(tests/console/test_console_lists.py measures those, and says why transaction=True)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from reservations.models import SeatHold
from tests import console_data
from tests.console.test_browser import ARTIFACTS, browser_page, log_in, served  # noqa: F401
from tests.console.test_console_lists import misfits, missing_colours, unknown_state
from tests.factories import SeatHoldFactory

# Each list, the table to measure on it, and text it must show with console_data's rows.
LISTS = [
    ("seat-holds", "/admin/reservations/seathold/", "#result_list",
     ["unknown: HELD", "awaiting cleanup"]),
    ("reminders", "/admin/reservations/reminder/", "#result_list",
     ["unknown: bogus", "pending, overdue", "ready to send", "sending",
      "Refused by the mail server"]),
    ("reminder-attempts", "/admin/reservations/reminderattempt/", "#result_list",
     ["push-notification"]),
    ("sections", "/admin/reservations/section/", "#result_list", ["12,000"]),
    ("tenants", "/admin/reservations/tenant/", "#result_list", ["Northern Lakes"]),
]


@pytest.mark.django_db
def test_hold_list_has_filters_search_and_badges(admin_client, section):
    SeatHoldFactory(section=section, expired=True, learner_ref="ada")
    SeatHoldFactory(section=section, learner_ref="grace")
    url = reverse("admin:reservations_seathold_changelist")

    expired = admin_client.get(url + "?expired=yes")
    found = admin_client.get(url + "?q=grace")

    assert [h.learner_ref for h in expired.context["cl"].queryset] == ["ada"]
    assert "expired, awaiting cleanup" in expired.content.decode()
    assert [h.learner_ref for h in found.context["cl"].queryset] == ["grace"]


@pytest.mark.django_db
def test_the_reminders_list_shows_states_and_filters_the_due_unsent(admin_client, section):
    from reservations.services import confirm_hold, hold_seat

    hold_seat(section.pk, "overdue-learner", now=timezone.now() - timedelta(minutes=11))
    later = hold_seat(section.pk, "later-learner")
    confirm_hold(hold_seat(section.pk, "confirmed-learner").pk)
    url = reverse("admin:reservations_reminder_changelist")
    page = admin_client.get(url).content.decode()
    assert "pending, overdue" in page and "cancelled" in page
    due = admin_client.get(url, {"due": "unsent"}).content.decode()
    assert "overdue-learner" in due and "later-learner" not in due
    assert admin_client.get(url, {"q": "not-a-number"}).status_code == 200
    assert str(later.pk) in admin_client.get(url, {"q": str(later.pk)}).content.decode()
    assert admin_client.get(reverse("admin:reservations_reminder_add")).status_code == 403


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_every_list_fits_a_laptop_with_the_sidebar_open(browser_page, served):  # noqa: F811
    page = browser_page
    User.objects.create_superuser("operator", "op@example.com", "correct horse")
    console_data.build()
    ARTIFACTS.mkdir(exist_ok=True)
    log_in(page, served)
    assert page.request.get(f"{served}/static/cleanup/console.css").status == 200

    assert misfits(page, served, LISTS) == {}


@pytest.mark.django_db
def test_a_hold_with_a_status_written_by_hand_shows_as_unknown(admin_client, section):
    hold = SeatHoldFactory(section=section)
    unknown_state("reservations_seathold", "status", "HELD", hold.pk)

    page = admin_client.get(reverse("admin:reservations_seathold_changelist"))

    assert page.status_code == 200
    assert ('<span class="state-badge state-unknown" title="a status the code does not know">'
            "unknown: HELD</span>") in page.content.decode()


@pytest.mark.django_db
def test_a_reminder_with_a_state_written_by_hand_shows_as_unknown(admin_client, section):
    from reservations.services import hold_seat

    hold = hold_seat(section.pk, "ada")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE reservations_reminder SET state = 'bogus' WHERE hold_id = %s",
                       [hold.pk])

    page = admin_client.get(reverse("admin:reservations_reminder_changelist"))

    assert page.status_code == 200
    assert ('<span class="state-badge state-unknown" title="a state the code does not know">'
            "unknown: bogus</span>") in page.content.decode()


def test_every_badge_state_has_a_colour_in_the_stylesheet():
    from reservations.admin import HOLD_BADGES, REMINDER_BADGES
    from reservations.models import Reminder

    classes = {*(f"state-{s}" for s, _ in HOLD_BADGES.values()),
               *(f"state-{s}" for s, _ in REMINDER_BADGES.values()),
               "state-expired"}
    assert missing_colours(classes) == set()
    assert set(HOLD_BADGES) == set(SeatHold.Status.values)
    assert set(REMINDER_BADGES) == {*Reminder.State.values, "overdue"}


@pytest.mark.django_db
def test_the_lists_count_their_rows_with_separators(admin_client, section):
    # Ids none of which reads 1234 (the sequence's next ids could): only a count without
    # its separator would show it as a number of its own.
    expires = (timezone.now() - timedelta(hours=1)).replace(microsecond=0)
    SeatHold.objects.bulk_create(
        SeatHold(pk=20_000 + n, tenant=section.tenant, section=section,
                 learner_ref=f"learner-{n}", expires_at=expires) for n in range(1_234))

    holds = admin_client.get(reverse("admin:reservations_seathold_changelist"))
    found = admin_client.get(reverse("admin:reservations_seathold_changelist"),
                             {"q": "learner-1"})
    chunks = admin_client.get(reverse("admin:cleanup_chunk_changelist"))

    listing = " ".join(holds.content.decode().split())
    assert "1,234 seat holds" in listing
    assert "Select all 1,234 seat holds" in listing and "All 1,234 selected" in listing
    assert re.search(r"345 results \(<a href=[^>]*>1,234 total</a>\)",
                     " ".join(found.content.decode().split()))
    # As a number of its own: a timestamp's microseconds (09.312342) may hold the digits.
    assert not re.search(r"(?<![\d.,:])1234(?![\d,])", listing)
    assert "0 chunks" in " ".join(chunks.content.decode().split())  # the console's own
