"""The waitlist under load: cleanup's chunks and learners free seats while two
publishers offer them, learners confirm, leave and walk in, all at once, each on its
own connection. Afterwards every freed seat produced exactly one record, no learner
got two seats, no section is over capacity, and every mail is on record once.

transaction=True: each thread works on its own connection and must see what the
others committed; a test transaction would hide it from them.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from contextlib import suppress
from datetime import timedelta

import pytest
from django.core import mail
from django.db import connections
from django.db.models import Count
from django.utils import timezone

from cleanup.engine.dispatch import dispatch
from cleanup.engine.worker import apply_chunk
from cleanup.models import Event
from cleanup.outbox import publish
from reservations.exceptions import ReservationError, SectionFull
from reservations.models import FreedSeat, OfferMail, SeatHold, WaitlistEntry
from reservations.services import confirm_hold, hold_seat, release_hold, seats_taken
from reservations.waitlist import SEAT_FREED, join_waitlist, leave_waitlist
from tests.factories import SeatHoldFactory, SectionFactory

pytestmark = pytest.mark.django_db(transaction=True)

SECTIONS, CAPACITY, WAITING = 20, 12, 8
EXPIRED, RELEASED = 4, 3  # per section, of its CAPACITY holds
QUIET = 40  # expired holds in sections nobody waits for: no event at all
ROUNDS = 5  # cleanup runs, each after the offers not to be confirmed expired


def pending() -> bool:
    return Event.objects.filter(name=SEAT_FREED, state="pending").exists()


class Workers:
    """Threads that record what went wrong instead of dying silently."""

    def __init__(self):
        self.threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []
        self.stop = threading.Event()

    def start(self, target, *args) -> None:
        def run():
            try:
                target(*args)
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                self.errors.append(exc)
                self.stop.set()
            finally:
                connections.close_all()
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.threads.append(thread)

    def join(self) -> None:
        for thread in self.threads:
            thread.join(timeout=120)
            assert not thread.is_alive(), "a worker never finished"


def test_every_freed_seat_is_offered_once_under_concurrent_publishers_and_learners(
        chunk_size):
    chunk_size("expire-holds", 25)
    sections = [SectionFactory(capacity=CAPACITY) for _ in range(SECTIONS)]
    releasable = []
    for section in sections:
        holds = SeatHoldFactory.create_batch(CAPACITY, section=section)
        for n in range(WAITING):
            join_waitlist(section.pk, f"s{section.pk}-waiting-{n}")
        SeatHold.objects.filter(pk__in=[h.pk for h in holds[:EXPIRED]]).update(
            expires_at=timezone.now() - timedelta(minutes=1))
        releasable += holds[EXPIRED:EXPIRED + RELEASED]
    quiet = SectionFactory(capacity=100)
    SeatHoldFactory.create_batch(QUIET, section=quiet, expired=True)
    random.Random(7).shuffle(releasable)
    walk_ins = Counter()
    workers = Workers()
    cleaning_done = threading.Event()
    started = time.monotonic()

    def publisher():
        while not (cleaning_done.is_set() and not pending()) and not workers.stop.is_set():
            if not publish(batch=10).handled:
                time.sleep(0.01)

    def releaser(holds):
        for hold in holds:
            release_hold(hold.pk)
            time.sleep(0.005)

    def cleaner():
        for _ in range(ROUNDS):
            # The offers of odd entries are never confirmed: they lapse through cleanup.
            lapsing = WaitlistEntry.objects.filter(state="offered").values_list(
                "offer_hold_id", "pk")
            SeatHold.objects.filter(
                pk__in=[hold for hold, pk in lapsing if pk % 2], status="held").update(
                expires_at=timezone.now() - timedelta(seconds=1))
            run = dispatch("expire-holds").run
            for chunk in run.chunks.order_by("chunk_id"):
                apply_chunk(chunk.message)
            time.sleep(0.3)
        cleaning_done.set()

    def confirmer():
        while not cleaning_done.is_set():
            for hold_id, pk in WaitlistEntry.objects.filter(state="offered").values_list(
                    "offer_hold_id", "pk"):
                if pk % 2 == 0:
                    with suppress(ReservationError):  # expired, or confirmed already
                        confirm_hold(hold_id)
            time.sleep(0.02)

    def leaver():
        for section in sections[::4]:
            entry = (WaitlistEntry.objects.filter(section=section, state__in=("waiting",
                                                                              "offered"))
                     .order_by("-pk").first())
            if entry:
                leave_waitlist(entry.pk)
            time.sleep(0.05)

    def walker():
        n = 0
        while not cleaning_done.is_set():
            section = sections[n % SECTIONS]
            try:
                hold_seat(section.pk, f"walk-in-{n}")
                walk_ins[section.pk] += 1
            except SectionFull:
                pass
            n += 1
            time.sleep(0.005)

    for _ in range(2):
        workers.start(publisher)
    for share in (releasable[0::2], releasable[1::2]):
        workers.start(releaser, share)
    for work in (cleaner, confirmer, leaver, walker):
        workers.start(work)
    workers.join()
    assert workers.errors == []
    while publish(batch=100).handled:
        pass
    elapsed = time.monotonic() - started

    events = Event.objects.filter(name=SEAT_FREED)
    freed = FreedSeat.objects.all()
    outcomes = Counter(freed.values_list("outcome", flat=True))
    print(f"\n{events.count()} events, {dict(outcomes)}, {SECTIONS} sections, "
          f"{SeatHold.objects.count()} holds left, walk-ins {sum(walk_ins.values())}, "
          f"2 publishers, {elapsed:.1f} s")

    # Events delivered == events written, and the quiet sections wrote none.
    assert events.count() >= SECTIONS * (EXPIRED + RELEASED)
    assert set(events.values_list("state", flat=True)) == {"delivered"}
    assert not events.filter(payload__section_id=quiet.pk).exists()
    assert not SeatHold.objects.filter(section=quiet).exists()
    # Each freed seat produced exactly one record.
    assert sorted(freed.values_list("event_key", flat=True)) == sorted(
        e.dedup_id for e in events)
    assert outcomes["offered"] > SECTIONS * WAITING // 2
    assert outcomes["no_room"] == 0  # nobody outside the line took a seat it waited for
    # No learner holds two offers from one freed seat, nor two seats anywhere.
    assert not freed.filter(outcome="offered").values("entry").annotate(
        n=Count("pk")).filter(n__gt=1).exists()
    offered_entries = WaitlistEntry.objects.exclude(offer_hold_id=None)
    assert offered_entries.count() == outcomes["offered"]
    assert offered_entries.values("offer_hold_id").distinct().count() == outcomes["offered"]
    assert not SeatHold.objects.values("section", "learner_ref").annotate(
        n=Count("pk")).filter(n__gt=1).exists()
    # No section over capacity.
    now = timezone.now()
    assert max(seats_taken(s.pk, now) for s in sections) <= CAPACITY
    # Every mail's Message-ID on record once, and every record's mail sent.
    sent = Counter(m.extra_headers["Message-ID"] for m in mail.outbox)
    assert set(sent.values()) == {1}
    assert sorted(sent) == sorted(OfferMail.objects.values_list("message_id", flat=True))
    assert OfferMail.objects.count() == outcomes["offered"]
