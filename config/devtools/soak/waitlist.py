"""The soak's waitlists: full sections whose seats free up while it runs (cleanup's
chunks expire holds, learners release them), learners confirming, declining and
leaving offers and joining the line, and what the report finds about it afterwards."""

from __future__ import annotations

import random
import threading
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connection, connections
from django.db.models import Count
from django.utils import timezone

from cleanup.models import Event
from config.devtools.soak import publishers, reminders
from config.devtools.soak.traffic import TrafficLog
from reservations.exceptions import ReservationError, SeatAvailable
from reservations.models import FreedSeat, OfferMail, SeatHold, Section, Tenant, WaitlistEntry
from reservations.services import confirm_hold, hold_seat, release_hold
from reservations.waitlist import SEAT_FREED, join_waitlist, leave_waitlist, offer_message_id

# Per waitlisted section: its seats, how many of their holds expire while the soak runs
# (cleanup frees those), and the learners in line at the start. One section per
# SECONDS_PER_SECTION seconds of soak, so longer soaks keep freeing seats.
CAPACITY, EXPIRING, WAITING = 20, 8, 16
SECONDS_PER_SECTION, MIN_SECTIONS = 6, 4
IN_LINE = (WaitlistEntry.State.WAITING, WaitlistEntry.State.OFFERED)
# Seats taken per waitlisted section, as one snapshot: a hold counts until its expiry
# by the clock read after the snapshot, never before a decision made in it.
OVER_CAPACITY = f"""
SELECT coalesce(max(taken - capacity), 0) FROM (
    SELECT section.capacity, count(hold.id) FILTER (
        WHERE hold.status = 'confirmed' OR hold.expires_at > clock_timestamp()) AS taken
    FROM "{Section._meta.db_table}" AS section
    LEFT JOIN "{SeatHold._meta.db_table}" AS hold ON hold.section_id = section.id
    WHERE section.id = ANY(%s)
    GROUP BY section.id
) AS per_section
"""


def seed(duration: float, now: datetime) -> dict:
    """Full sections with learners in line, some of their holds expiring over the soak;
    return what was made."""
    tenants = list(Tenant.objects.order_by("pk"))
    count = max(MIN_SECTIONS, round(duration / SECONDS_PER_SECTION))
    sections = Section.objects.bulk_create(
        Section(tenant=tenants[n % len(tenants)], title=f"waitlisted {n}", capacity=CAPACITY)
        for n in range(count))
    holds = SeatHold.objects.bulk_create(
        SeatHold(tenant_id=section.tenant_id, section=section, learner_ref=f"wl{s}-seat-{i}",
                 # The first EXPIRING seats expire evenly over the soak, the rest outlast it.
                 expires_at=now + (timedelta(seconds=duration * (1 + i * count + s)
                                             / (EXPIRING * count + 1))
                                   if i < EXPIRING else timedelta(hours=1)))
        for s, section in enumerate(sections) for i in range(CAPACITY))
    reminded = reminders.remind(holds)
    for s, section in enumerate(sections):
        for n in range(WAITING):
            join_waitlist(section.pk, f"wl{s}-waiting-{n}", now=now)
    return {"sections": [section.pk for section in sections], "holds": len(holds),
            "reminders": reminded, "waiting": count * WAITING}


@dataclass
class WaitlistLog:
    """What the learners in waitlisted sections did, by action."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    actions: Counter = field(default_factory=Counter)

    def count(self, action: str) -> None:
        with self.lock:
            self.actions[action] += 1


class WaitlistLearners(threading.Thread):
    """One thread of learners in waitlisted sections: seated learners giving their seat
    back, offered ones confirming, declining or leaving, new ones joining the line (or
    holding the seat it tells them is free)."""

    def __init__(self, log: TrafficLog, waitlist_log: WaitlistLog, sections: list[int],
                 stop: threading.Event, seed: int):
        super().__init__(daemon=True)
        self.log, self.waitlist_log, self.sections = log, waitlist_log, sections
        self.stop, self.random = stop, random.Random(seed)

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.act()
                self.stop.wait(self.random.uniform(0.05, 0.25))
        finally:
            connections.close_all()

    def act(self) -> None:
        choice = self.random.random()
        try:
            if choice < 0.3:
                self._release(offered=False, action="released_a_seat")
            elif choice < 0.5:
                self._confirm()
            elif choice < 0.6:
                self._release(offered=True, action="declined_an_offer")
            elif choice < 0.75:
                self._leave()
            else:
                self._join()
        except ReservationError:
            self.waitlist_log.count("refused")

    def _offers(self):
        return WaitlistEntry.objects.filter(section_id__in=self.sections,
                                            state=WaitlistEntry.State.OFFERED)

    def _release(self, *, offered: bool, action: str) -> None:
        offers = self._offers().values("offer_hold_id")
        holds = SeatHold.objects.filter(section_id__in=self.sections,
                                        status=SeatHold.Status.HELD,
                                        expires_at__gt=timezone.now())
        holds = holds.filter(pk__in=offers) if offered else holds.exclude(pk__in=offers)
        pk = holds.order_by("?").values_list("pk", flat=True).first()
        if pk is not None and release_hold(pk):
            self.log.add("released", pk)
            self.waitlist_log.count(action)

    def _confirm(self) -> None:
        pk = self._offers().order_by("?").values_list("offer_hold_id", flat=True).first()
        if pk is not None:
            confirm_hold(pk)
            self.log.add("confirmed", pk)
            self.waitlist_log.count("confirmed_an_offer")

    def _leave(self) -> None:
        # An offer's hold goes with its learner: released_by_leaving() finds those.
        entry_id = (WaitlistEntry.objects.filter(section_id__in=self.sections, state__in=IN_LINE)
                    .order_by("?").values_list("pk", flat=True).first())
        if entry_id is not None and leave_waitlist(entry_id).state == WaitlistEntry.State.LEFT:
            self.waitlist_log.count("left_the_line")

    def _join(self) -> None:
        section = self.random.choice(self.sections)
        learner = f"wl-joining-{self.random.random()}"
        try:
            join_waitlist(section, learner)
            self.waitlist_log.count("joined")
        except SeatAvailable:
            # A learner can always do one of the two: the line says a seat is theirs.
            hold = hold_seat(section, learner)
            self.log.add("created", hold.pk)
            self.waitlist_log.count("held_a_free_seat_instead")


class WaitlistSoak:
    """The waitlists' part of a soak: its learners, the clusters' publishers enqueued,
    the faults on them, and the capacity probe."""

    def __init__(self, sections: list[int], clusters: list, log: TrafficLog,
                 stop: threading.Event, seed: int):
        self.sections = sections
        self.log = WaitlistLog()
        self.learners = WaitlistLearners(log, self.log, sections, stop, seed)
        self.publishers = publishers.Publishers(clusters, stop)
        self.faults = publishers.PublisherFaults(clusters, log, self.publishers, stop, seed + 1)
        self.probe = CapacityProbe(sections, stop)
        self.drained: Counter = Counter()

    @property
    def threads(self) -> tuple[threading.Thread, ...]:
        return self.learners, self.publishers, self.faults, self.probe

    def drain(self) -> None:
        """Deliver what the clusters' publishers left, in this process."""
        self.drained = publishers.drain()

    def figures_and_checks(self, since: datetime) -> tuple[dict, dict]:
        figures, checks = figures_and_checks(since, self.sections, self.log, self.probe)
        figures["publishers"] = publishers.figures(since, self.publishers, self.drained,
                                                   self.faults)
        return figures, checks


class CapacityProbe(threading.Thread):
    """Samples the seats taken in the waitlisted sections while the soak runs, and keeps
    the most any section had beyond its capacity."""

    def __init__(self, sections: list[int], stop: threading.Event):
        super().__init__(daemon=True)
        self.sections, self.stop = sections, stop
        self.samples, self.peak_over = 0, 0

    def run(self) -> None:
        try:
            while not self.stop.wait(0.25):
                self.peak_over = max(self.peak_over, over_capacity(self.sections))
                self.samples += 1
        finally:
            connections.close_all()


def over_capacity(sections: list[int]) -> int:
    """The most seats any of ``sections`` has taken beyond its capacity (0 if none)."""
    with connection.cursor() as cursor:
        cursor.execute(OVER_CAPACITY, [sections])
        return cursor.fetchone()[0]


def offers_made() -> int:
    """Holds the waitlist's handler created: one per seat offered."""
    return FreedSeat.objects.filter(outcome=FreedSeat.Outcome.OFFERED).count()


def released_by_leaving(since: datetime) -> set[int]:
    """Offer holds their learner's leaving the line deleted: those of the entries that
    left with an offer, but for any a learner released or a chunk deleted first (its
    event names a run). Which one it was cannot be told as it happens: an offer may
    come between the learner reading their entry and leave_waitlist locking it."""
    offers = WaitlistEntry.objects.filter(state=WaitlistEntry.State.LEFT).exclude(
        offer_hold_id=None).values_list("offer_hold_id", flat=True)
    by_chunks = Event.objects.filter(name=SEAT_FREED, created_at__gte=since).exclude(
        run_id=None).values_list("payload__hold_id", flat=True)
    return set(offers) - set(by_chunks)


def figures_and_checks(since: datetime, sections: list[int], waitlist_log: WaitlistLog,
                       probe: CapacityProbe) -> tuple[dict, dict]:
    """What became of the freed seats, and the checks on it."""
    events = Event.objects.filter(name=SEAT_FREED, created_at__gte=since)
    by_key = {event.dedup_id: event for event in events.only(
        "name", "key", "payload", "state", "run_id")}
    states = Counter(event.state for event in by_key.values())
    by_chunks = sum(event.run_id is not None for event in by_key.values())
    freed = FreedSeat.objects.all()  # the wipe emptied them with the sections
    recorded = list(freed.values_list("event_key", flat=True))
    outcomes = Counter(freed.values_list("outcome", flat=True))
    offers = WaitlistEntry.objects.exclude(offer_event_key="")
    offered_by_entry = dict(freed.filter(outcome=FreedSeat.Outcome.OFFERED).values_list(
        "entry_id", "event_key"))
    twice_offered_seats = (offers.values("offer_event_key").annotate(n=Count("pk"))
                           .filter(n__gt=1).count())
    entries_not_as_recorded = sum(
        offered_by_entry.get(pk) != key
        for pk, key in offers.values_list("pk", "offer_event_key"))
    two_seats = (SeatHold.objects.filter(section_id__in=sections)
                 .values("section_id", "learner_ref").annotate(n=Count("pk"))
                 .filter(n__gt=1).count())
    mails = list(OfferMail.objects.values_list("message_id", "entry_id"))
    mails_per_offer = Counter(entry for _, entry in mails)
    expected_ids = {offer_message_id(by_key[entry.offer_event_key], entry)
                    for entry in offers if entry.offer_event_key in by_key}
    beside_a_free_seat = waiting_beside_a_free_seat(sections)
    over_at_end = over_capacity(sections)
    figures = {
        "sections": len(sections),
        "events_written": len(by_key),
        "events_by_state": dict(states),
        "events_by_source": {"chunks": by_chunks, "learners": len(by_key) - by_chunks},
        # Handler calls that failed, or that never returned (as the outbox counts them).
        "failed_attempts_recorded": sum(events.values_list("attempts", flat=True)),
        "freed_seats": dict(outcomes),
        "offers": {"made": offers.count(), **Counter(offers.values_list("state", flat=True))},
        "mails": len(mails),
        "learner_actions": dict(waitlist_log.actions),
        "capacity_samples": probe.samples,
        "most_seats_beyond_capacity": max(probe.peak_over, over_at_end),
        "learners_waiting_beside_a_free_seat": beside_a_free_seat,
    }
    checks = {
        "every seat_freed event delivered (none pending, none dead), delivered = written":
            states[Event.State.DELIVERED] == len(by_key) > 0,
        "each freed seat produced exactly one FreedSeat (same count, same keys)":
            len(recorded) == len(by_key) and set(recorded) == set(by_key),
        "every freed seat's hold is gone (no event without its DELETE)":
            not SeatHold.objects.filter(pk__in=[
                event.payload["hold_id"] for event in by_key.values()]).exists(),
        "no freed seat offered twice, each offer as its FreedSeat records it":
            twice_offered_seats == 0 and entries_not_as_recorded == 0
            and offers.count() == outcomes[FreedSeat.Outcome.OFFERED],
        "no learner holds two seats in a waitlisted section": two_seats == 0,
        "no section had more seats taken than its capacity (sampled, and at the end)":
            probe.samples > 0 and probe.peak_over <= 0 and over_at_end <= 0,
        "every offer has exactly one OfferMail, under its event's Message-ID":
            len(mails) == offers.count() == len(mails_per_offer)
            and set(mails_per_offer.values()) <= {1}
            and {message_id for message_id, _ in mails} == expected_ids,
        "no learner left waiting beside a free seat": beside_a_free_seat == 0,
        "seats were freed by chunks and by learners, and offered, while the soak ran":
            0 < by_chunks < len(by_key) and outcomes[FreedSeat.Outcome.OFFERED] > 0,
    }
    return figures, checks


def waiting_beside_a_free_seat(sections: list[int]) -> int:
    """Learners still waiting in a section with fewer holds (of any state, expired ones
    too) than seats: a seat freed with no event to offer it to them."""
    capacity = dict(Section.objects.filter(pk__in=sections).values_list("pk", "capacity"))
    rows = dict(SeatHold.objects.filter(section_id__in=sections).values_list(
        "section_id").annotate(n=Count("pk")).order_by())
    waiting = dict(WaitlistEntry.objects.filter(
        section_id__in=sections, state=WaitlistEntry.State.WAITING).values_list(
        "section_id").annotate(n=Count("pk")).order_by())
    return sum(n for section, n in waiting.items() if rows.get(section, 0) < capacity[section])
