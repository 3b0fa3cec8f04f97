"""The events list and a dead event's page as an operator reads them in Chromium at
1366x768: nothing wider than the window, however long a key, a payload's string or a
traceback's line.

transaction=True: the live server thread reads the events through its own connection.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db import transaction

from cleanup.models import Event
from cleanup.outbox import emit, publish, registered
from tests.console.test_browser import ARTIFACTS, browser_page, log_in  # noqa: F401  (fixture)
from tests.console.test_console_lists import measure
from tests.outbox.test_console_events import EventFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

FITS = """() => ({page: document.documentElement.scrollWidth, window: window.innerWidth})"""
LONG = "x" * 400  # one word: it cannot wrap


def refuse(event):
    raise ValueError(f"mail server refused {event.key}: {LONG}")


def test_the_events_list_and_a_dead_events_page_fit_a_laptop(
        browser_page, live_server, settings):  # noqa: F811
    page = browser_page
    User.objects.create_superuser("operator", "op@example.com", "correct horse")
    settings.CLEANUP_EVENT_MAX_ATTEMPTS = 1
    with transaction.atomic():
        emit("reservations.seat_freed", f"seathold:{'9' * 200}", {"note": LONG},
             ordering_key=f"section:{'7' * 200}")
    with registered(**{"reservations.seat_freed": refuse}):
        assert publish().dead == 1
    settings.CLEANUP_EVENT_MAX_ATTEMPTS = 10
    dead = Event.objects.get()
    EventFactory.create_batch(20)
    EventFactory(state=Event.State.PENDING, delivered_at=None, attempts=3,
                 cause=f"OperationalError: {LONG[:200]}")
    ARTIFACTS.mkdir(exist_ok=True)
    page.set_viewport_size({"width": 1366, "height": 768})
    log_in(page, live_server.url)

    page.goto(f"{live_server.url}/admin/cleanup/event/")
    listing = measure(page, "#result_list")
    listing_text = page.inner_text("#result_list")
    rows = page.locator("#result_list tbody tr").count()
    page.screenshot(path=str(ARTIFACTS / "events-1366.png"))

    page.goto(f"{live_server.url}/admin/cleanup/event/{dead.pk}/change/")
    event_fits = page.evaluate(FITS)
    event_text = page.inner_text("#content")
    actions = [page.locator(f"#{name}-event").is_visible() for name in ("requeue", "discard")]
    page.screenshot(path=str(ARTIFACTS / "event-dead-1366.png"), full_page=True)

    assert rows == 22
    assert listing["styled"] and listing["sidebar_open"], listing
    assert listing["page"] <= listing["window"], listing
    assert listing["table"] <= listing["room"] and listing["clipped"] == [], listing
    assert "ValueError: mail server refused" in listing_text
    assert event_fits["page"] <= event_fits["window"], event_fits
    assert "Traceback (most recent call last)" in event_text
    assert f'"note": "{LONG}"' in event_text
    assert actions == [True, True]
