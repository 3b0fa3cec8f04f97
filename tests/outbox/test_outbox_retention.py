"""Settled events are purged by the engine's own policy after CLEANUP_EVENT_RETENTION_DAYS,
and /metrics' totals of them, counted as they settle, never go down; a scrape that
cannot read the outbox in time says so, and the oldest pending age goes on growing."""

from __future__ import annotations

import threading
from datetime import timedelta

import psycopg
import pytest
from django.db import transaction
from django.utils import timezone

from cleanup.engine.dispatch import dispatch_in_process
from cleanup.models import Event, Total
from cleanup.outbox import discard, emit, publish, registered
from cleanup.retention import PURGE_EVENTS
from tests.conftest import database_url
from tests.observability.test_metrics import scrape
from tests.outbox_handlers import record_effect


def value(samples: dict, metric: str, **labels) -> float:
    return samples[metric, frozenset(labels.items())]

pytestmark = pytest.mark.django_db
OLD = timezone.now() - timedelta(days=8)


def fail(event):
    raise ValueError("refused")


def seed() -> None:
    """Four events of seat.freed (2 delivered, 1 dead then discarded, 1 dead) and one
    pending of mail.offer, all settled eight days ago but the pending one."""
    with transaction.atomic():
        for n in range(4):
            emit("seat.freed", f"hold:{n}", {})
        emit("mail.offer", "hold:9", {})
    with registered(**{"seat.freed": record_effect}):
        publish(batch=2)
    Event.objects.filter(key__in=["hold:2", "hold:3"]).update(state="dead", settled_at=OLD)
    discard(Event.objects.filter(key="hold:2").values_list("pk", flat=True), "a test")
    Event.objects.exclude(state="pending").update(settled_at=OLD)


def totals(client) -> dict:
    samples = scrape(client)
    return {metric: value(samples, metric, name="seat.freed")
            for metric in ("cleanup_events_delivered_total", "cleanup_events_discarded_total",
                           "cleanup_events_dead")}


def test_settled_events_are_purged_after_retention_and_totals_keep_their_values(client):
    seed()
    before = totals(client)
    assert before == {"cleanup_events_delivered_total": 2,
                      "cleanup_events_discarded_total": 1, "cleanup_events_dead": 1}

    run = dispatch_in_process(PURGE_EVENTS).run
    assert run.state == "completed"
    # Delivered and discarded went; the dead one waits for an operator, the pending one
    # for its publisher.
    assert sorted(Event.objects.values_list("key", "state")) == [
        ("hold:3", "dead"), ("hold:9", "pending")]
    assert totals(client) == before

    dispatch_in_process(PURGE_EVENTS)  # again: nothing left to take, nothing added twice
    assert totals(client) == before
    assert Total.objects.get(family="event", subject="seat.freed").figures == {
        "delivered": 2, "discarded": 1}


def test_recently_settled_events_stay(client, settings):
    seed()
    Event.objects.exclude(state="pending").update(settled_at=timezone.now() - timedelta(days=6))
    dispatch_in_process(PURGE_EVENTS)
    assert Event.objects.count() == 5
    settings.CLEANUP_EVENT_RETENTION_DAYS = 5
    dispatch_in_process(PURGE_EVENTS)
    assert Event.objects.count() == 2


def test_a_total_edited_by_hand_into_another_state_is_left_out_never_a_500(client):
    Total.objects.create(family="event", subject="seat.freed", figures={
        "<b>lost</b>": 3, "delivered": 4, "dead": 5,  # dead: read live only
        "discarded": "many"})
    Total.objects.create(family="event", subject="seat.held", figures=[1, 2])
    samples = scrape(client)
    assert value(samples, "cleanup_events_delivered_total", name="seat.freed") == 4
    assert ("cleanup_events_dead", frozenset({("name", "seat.freed")})) not in samples
    assert ("cleanup_events_discarded_total", frozenset({("name", "seat.freed")})) not in samples
    assert value(samples, "cleanup_events_measured") == 1


@pytest.mark.django_db(transaction=True)
def test_a_scrape_behind_a_table_lock_answers_unknown_and_the_age_goes_on(client, settings):
    """With cleanup_event locked by another session, the scrape answers within its
    budget: no pending counts or totals (unknown, not 0), measured 0, and the oldest
    pending age grown from the last reading, so its alert still fires."""
    with transaction.atomic():
        emit("seat.freed", "hold:1", {})
    Event.objects.update(created_at=timezone.now() - timedelta(minutes=12))
    first = scrape(client)
    assert value(first, "cleanup_events_pending", name="seat.freed") == 1
    assert 720 <= value(first, "cleanup_events_oldest_pending_age_seconds") < 780

    locked, release = threading.Event(), threading.Event()

    def hold_the_table():
        with psycopg.connect(database_url(), autocommit=True) as other:
            other.execute("BEGIN; LOCK TABLE cleanup_event IN ACCESS EXCLUSIVE MODE")
            locked.set()
            release.wait(60)

    holder = threading.Thread(target=hold_the_table)
    holder.start()
    try:
        assert locked.wait(10)
        behind = scrape(client)
    finally:
        release.set()
        holder.join()
    assert value(behind, "cleanup_events_measured") == 0
    assert not [key for key in behind if key[0] in {
        "cleanup_events_pending", "cleanup_events_delivered_total"}]
    assert value(behind, "cleanup_events_oldest_pending_age_seconds") >= value(
        first, "cleanup_events_oldest_pending_age_seconds")


