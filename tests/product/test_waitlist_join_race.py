"""A learner joining a waitlist while cleanup's chunk deletes a hold of that section, on
two real connections: the join either sees the seat freed (and refuses: hold it) or
commits its entry before the chunk's trigger looks, which then writes the seat's
event. Never an entry waiting beside a free seat that no event will offer."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from cleanup.models import Event
from reservations.exceptions import SeatAvailable
from reservations.models import SeatHold, WaitlistEntry
from reservations.waitlist import SEAT_FREED, join_waitlist
from tests.conftest import database_url
from tests.factories import SeatHoldFactory, SectionFactory

pytestmark = pytest.mark.django_db(transaction=True)



def test_a_join_during_a_chunks_delete_waits_for_it_and_sees_the_seat_free():
    section = SectionFactory(capacity=2)
    now = timezone.now()
    SeatHoldFactory(section=section, learner_ref="ada", expires_at=now + timedelta(hours=1))
    # Alive as the learner looks; the chunk takes it as it expires (its cutoff later).
    ending = SeatHoldFactory(section=section, learner_ref="bo",
                             expires_at=now + timedelta(hours=1))
    with psycopg.connect(database_url()) as chunk:
        chunk.execute("DELETE FROM reservations_seathold WHERE id = %s", [ending.pk])
        # The chunk's trigger has looked for a waitlist and found none: no event.
        done = threading.Event()
        outcome = {}

        def join():
            try:
                outcome["entry"] = join_waitlist(section.pk, "cy", now=now)
            except SeatAvailable as refused:
                outcome["refused"] = refused
            except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                outcome["error"] = exc
            finally:
                connection.close()
                done.set()

        joiner = threading.Thread(target=join)
        joiner.start()
        # The join waits for the uncommitted DELETE instead of counting its seat taken.
        assert not done.wait(0.5)
        chunk.commit()
        joiner.join(10)
    assert "refused" in outcome, outcome  # the seat is free: the learner holds it instead
    assert not WaitlistEntry.objects.exists() and not Event.objects.exists()


def test_a_join_committed_first_makes_the_chunks_trigger_write_the_event():
    section = SectionFactory(capacity=1)
    now = timezone.now()
    hold = SeatHoldFactory(section=section, learner_ref="ada",
                           expires_at=now + timedelta(hours=1))
    entry = join_waitlist(section.pk, "cy", now=now)
    with psycopg.connect(database_url()) as chunk:
        chunk.execute("DELETE FROM reservations_seathold WHERE id = %s", [hold.pk])
    assert entry.state == "waiting"
    assert list(Event.objects.values_list("name", "key")) == [
        (SEAT_FREED, f"seathold:{hold.pk}")]


def test_a_join_never_waits_for_a_renewal():
    """The seats are key-share locked: an UPDATE of a hold's expiry (a renewal) going on
    on another connection does not hold the join back."""
    section = SectionFactory(capacity=1)
    hold = SeatHoldFactory(section=section, learner_ref="ada",
                           expires_at=timezone.now() + timedelta(hours=1))
    with psycopg.connect(database_url()) as renewal:
        renewal.execute("UPDATE reservations_seathold SET expires_at = expires_at + "
                        "interval '15 minutes' WHERE id = %s", [hold.pk])
        started = time.monotonic()
        entry = join_waitlist(section.pk, "cy")
        waited = time.monotonic() - started
        renewal.commit()
    assert entry.state == "waiting"
    assert waited < 5  # the join would otherwise wait for the renewal's commit, forever
    assert SeatHold.objects.get().expires_at > hold.expires_at
