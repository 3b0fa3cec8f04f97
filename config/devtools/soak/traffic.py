"""Learners using the product while cleanup runs: every renewal, confirmation and
release is recorded so the soak can check none of them was undone."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connections
from django.utils import timezone

from reservations.exceptions import ReservationError
from reservations.models import Reminder, SeatHold, Section
from reservations.services import confirm_hold, hold_seat, release_hold, reminder_due, renew_hold

# A reminder this close to its due time is what a mark run may be marking right now.
FALLING_DUE = (timedelta(seconds=-1.5), timedelta(seconds=0.5))


@dataclass(frozen=True)
class Renewal:
    """One renewal: its hold, an instant by which it had committed, and the due time it
    gave the hold's reminder."""

    hold_id: int
    committed_by: datetime
    due_at: datetime


@dataclass
class TrafficLog:
    lock: threading.Lock = field(default_factory=threading.Lock)
    created: set = field(default_factory=set)
    renewed: set = field(default_factory=set)
    confirmed: set = field(default_factory=set)
    released: set = field(default_factory=set)
    renewals: list[Renewal] = field(default_factory=list)
    # Renewals of a hold whose reminder was falling due: the race with the marking.
    renewed_falling_due: int = 0
    refused: int = 0

    def add(self, kind: str, pk: int) -> None:
        with self.lock:
            getattr(self, kind).add(pk)

    def renewal(self, hold: SeatHold, *, falling_due: bool) -> None:
        renewal = Renewal(hold.pk, timezone.now(), reminder_due(hold.expires_at))
        with self.lock:
            self.renewed.add(hold.pk)
            self.renewals.append(renewal)
            self.renewed_falling_due += falling_due


class Learners(threading.Thread):
    """One thread of learner traffic through the reservation services."""

    def __init__(self, log: TrafficLog, stop: threading.Event, seed: int):
        super().__init__(daemon=True)
        self.log, self.stop, self.random = log, stop, random.Random(seed)

    def run(self) -> None:
        try:
            sections = list(Section.objects.values_list("pk", flat=True))
            while not self.stop.is_set():
                self.act(sections)
                self.stop.wait(self.random.uniform(0.005, 0.03))
        finally:
            connections.close_all()

    def act(self, sections: list[int]) -> None:
        choice = self.random.random()
        try:
            if choice < 0.25:
                hold = hold_seat(self.random.choice(sections), f"soak-{self.random.random()}")
                self.log.add("created", hold.pk)
            elif choice < 0.6:
                # Renew holds, some just expired: the race cleanup must lose; some whose
                # reminder is falling due: the race the marking must lose.
                kind = self.random.random()
                pk = (self._falling_due() if kind < 0.35
                      else self._pick(expired=kind < 0.65))
                if pk is not None:
                    self.log.renewal(renew_hold(pk), falling_due=kind < 0.35)
            elif choice < 0.8:
                pk = self._pick(expired=self.random.random() < 0.4)
                if pk is not None:
                    confirm_hold(pk)
                    self.log.add("confirmed", pk)
            else:
                pk = self._pick(expired=False)
                if pk is not None and release_hold(pk):
                    self.log.add("released", pk)
        except ReservationError:
            with self.log.lock:
                self.log.refused += 1

    def _pick(self, *, expired: bool) -> int | None:
        now = timezone.now()
        holds = SeatHold.objects.filter(status=SeatHold.Status.HELD)
        holds = holds.filter(expires_at__lte=now) if expired else holds.filter(
            expires_at__gt=now)
        with self.log.lock:
            touched = self.log.renewed | self.log.confirmed | self.log.released
        candidates = list(holds.exclude(pk__in=touched).order_by("?")
                          .values_list("pk", flat=True)[:1])
        return candidates[0] if candidates else None

    def _falling_due(self) -> int | None:
        """A held seat whose unsent reminder is due about now (renewed ones too: each
        renewal makes its reminder fall due again)."""
        now = timezone.now()
        earliest, latest = (now + offset for offset in FALLING_DUE)
        with self.log.lock:
            gone = self.log.confirmed | self.log.released
        candidates = list(
            Reminder.objects.filter(state__in=(Reminder.State.PENDING, Reminder.State.READY),
                                    due_at__range=(earliest, latest))
            .exclude(hold_id__in=gone).order_by("?").values_list("hold_id", flat=True)[:1])
        return candidates[0] if candidates else None
