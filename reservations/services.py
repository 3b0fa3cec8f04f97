"""Hold, renew, confirm and release seats; each takes the row locks it needs, in the one
order every learner's transaction takes them (docs/waitlist.md, *One lock order*).

Each keeps the hold's renewal reminder in step, in the same transaction: a hold gets
one when it is made, a renewal moves it, a confirmation cancels it, and releasing the
hold deletes it with the hold (in the database). Seats are counted against the
section's waitlist too (reservations.waitlist): learners waiting come first.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import ParamSpec, TypeVar

import structlog
from django.db import OperationalError, models, transaction
from django.db.models import Count, Max, Q, Subquery
from django.utils import timezone

from reservations.conf import conf
from reservations.exceptions import (
    Busy,
    HoldNotFound,
    HoldNotRenewable,
    SectionFull,
    WaitlistAhead,
)
from reservations.models import Reminder, SeatHold, Section, WaitlistEntry

log = structlog.get_logger("reservations.services")

# PostgreSQL's SQLSTATE for "deadlock detected" (psycopg's DeadlockDetected).
DEADLOCK_DETECTED = "40P01"
# A learner's transaction that deadlocked is tried once more, then refused.
LEARNER_ATTEMPTS = 2
P = ParamSpec("P")
R = TypeVar("R")


def learner_transaction(service: Callable[P, R]) -> Callable[P, R]:
    """Run a learner's service in a transaction of its own, once more after a deadlock;
    a second deadlock is refused with ``Busy``, never shown as a database error.

    Learners' transactions take their locks in one order and do not deadlock with each
    other; another kind of transaction (an operator's, another application's) still can,
    and the database then rolls one of the two back: this one is simply tried again.
    """

    @functools.wraps(service)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        attempt = 1
        while True:
            try:
                with transaction.atomic():
                    return service(*args, **kwargs)
            except OperationalError as exc:
                if getattr(exc.__cause__, "sqlstate", None) != DEADLOCK_DETECTED:
                    raise
                log.warning("learner transaction deadlocked", service=service.__name__,
                            attempt=attempt)
                if attempt == LEARNER_ATTEMPTS:
                    raise Busy(service.__name__) from exc
                attempt += 1

    return run


def locked_sections() -> models.QuerySet[Section]:
    """Sections, row-locked as every learner's transaction locks its section, first.

    FOR NO KEY UPDATE, not FOR UPDATE: the rows inserted under it (holds, entries,
    freed seats) key-share lock the section for their foreign key, and need not wait
    for another transaction's lock to do so."""
    return Section.objects.select_for_update(no_key=True)


def locked_section_of(model: type[models.Model], pk: int) -> Section | None:
    """Lock the section of a seat hold or waitlist entry (a row's section never changes)
    in one statement, reading nothing else of the row; None if the row is gone."""
    owner = model._default_manager.filter(pk=pk).values("section_id")[:1]
    return locked_sections().filter(pk=Subquery(owner)).first()


@learner_transaction
def hold_seat(section_id: int, learner_ref: str, *, now: datetime | None = None) -> SeatHold:
    """Hold a seat for the hold window; refuse when the section is full, or when its free
    seats are spoken for by learners on its waitlist (WaitlistAhead).

    A learner offered a seat from the waitlist gets their offer hold back (the seat is
    theirs already, not a second one); a learner still waiting who takes a seat left
    over beyond everyone else waiting leaves the waitlist.
    """
    # The section lock serialises seat counting, so two learners cannot both take the
    # last seat. The clock is read once it is granted, here and in every service: a
    # time read before a wait would count by a moment that has passed.
    section = locked_sections().get(pk=section_id)
    now = now or timezone.now()
    line = waitlist_line(section.pk, learner_ref)
    if line.offer_hold_id is not None:
        offer = SeatHold.objects.filter(pk=line.offer_hold_id, status=SeatHold.Status.HELD,
                                        expires_at__gt=now).first()
        if offer is not None:
            return offer
    _ensure_room(section, now, waiting=line.waiting)
    if line.own_waiting_id is not None:
        WaitlistEntry.objects.filter(pk=line.own_waiting_id,
                                     state=WaitlistEntry.State.WAITING).update(
            state=WaitlistEntry.State.LEFT)
    return create_hold(section, learner_ref, expires_at=now + _window(), now=now)


def create_hold(section: Section, learner_ref: str, *, expires_at: datetime,
                now: datetime) -> SeatHold:
    """Create a held seat and its renewal reminder; no checks: the caller holds the
    section's lock and has found the room (hold_seat, and the waitlist's offers)."""
    hold = SeatHold.objects.create(
        tenant_id=section.tenant_id,
        section=section,
        learner_ref=learner_ref,
        expires_at=expires_at,
        created_at=now,
        updated_at=now,
    )
    Reminder.for_hold(hold, reminder_due(hold.expires_at), now).save()
    return hold


@learner_transaction
def renew_hold(hold_id: int, *, now: datetime | None = None) -> SeatHold:
    """Move a held seat's expiry forward.

    Allowed while the hold still exists and is held, even past its expiry (cleanup
    may not have reached it yet), if the section still has room: an expired hold
    stopped counting against capacity, so it is counted anew.
    """
    section = _locked_section_of_hold(hold_id)
    now = now or timezone.now()
    hold = _locked_hold(hold_id)
    if hold.status != SeatHold.Status.HELD:
        raise HoldNotRenewable(hold_id, hold.status)
    if hold.expires_at <= now:
        _ensure_room(section, now, excluding=hold.pk,
                     waiting=waitlist_line(section.pk, hold.learner_ref).waiting)
    hold.expires_at = now + _window()
    hold.updated_at = now
    hold.save(update_fields=["expires_at", "updated_at"])
    _remind_again(hold, now)
    return hold


@learner_transaction
def confirm_hold(hold_id: int, *, now: datetime | None = None) -> SeatHold:
    """Turn a hold into a confirmed seat; confirming twice is harmless."""
    section = _locked_section_of_hold(hold_id)
    now = now or timezone.now()
    # A seat offered from the waitlist: its learner is through the line. The entry
    # before the hold, in the one order; a refusal below rolls this back with the rest.
    WaitlistEntry.objects.filter(offer_hold_id=hold_id,
                                 state=WaitlistEntry.State.OFFERED).update(
        state=WaitlistEntry.State.CONFIRMED)
    hold = _locked_hold(hold_id)
    if hold.status == SeatHold.Status.CONFIRMED:
        return hold
    if hold.expires_at <= now:
        _ensure_room(section, now, excluding=hold.pk,
                     waiting=waitlist_line(section.pk, hold.learner_ref).waiting)
    hold.status = SeatHold.Status.CONFIRMED
    hold.updated_at = now
    hold.save(update_fields=["status", "updated_at"])
    _unsent_reminder(hold).update(state=Reminder.State.CANCELLED, claimed_at=None,
                                  updated_at=now)
    return hold


@learner_transaction
def release_hold(hold_id: int) -> bool:
    """Give a held seat back at once (the learner's own action, or declining an offer);
    False if already gone.

    Scheduled cleanup is only the backstop for holds nobody released. The database
    deletes the hold's reminder with it, and writes its ``reservations.seat_freed``
    event when the section has a waitlist (migration 0008).
    """
    # The section's lock first, so that join_waitlist either sees the seat free (and
    # refuses: hold it instead) or commits its entry before this DELETE's trigger looks
    # for a waitlist: a learner joining while a seat is released is never left waiting
    # beside a free seat with no event to offer it.
    if locked_section_of(SeatHold, hold_id) is None:
        return False
    status = (SeatHold.objects.select_for_update().filter(pk=hold_id)
              .values_list("status", flat=True).first())
    if status is None:
        return False
    if status != SeatHold.Status.HELD:
        raise HoldNotRenewable(hold_id, status)
    deleted, _ = SeatHold.objects.filter(pk=hold_id, status=SeatHold.Status.HELD).delete()
    return bool(deleted)


def seats_taken(section_id: int, now: datetime, *, excluding: int | None = None) -> int:
    """Confirmed seats plus holds that have not expired."""
    taken = SeatHold.objects.filter(section_id=section_id).filter(
        Q(status=SeatHold.Status.CONFIRMED)
        | Q(status=SeatHold.Status.HELD, expires_at__gt=now)
    )
    if excluding is not None:
        taken = taken.exclude(pk=excluding)
    return taken.count()


@dataclass(frozen=True)
class WaitlistLine:
    """A section's waitlist as one learner sees it."""

    waiting: int  # learners waiting, the one asking left out
    own_waiting_id: int | None  # their own entry, if they wait
    offer_hold_id: int | None  # the hold offered to them, if any


def waitlist_line(section_id: int, learner_ref: str) -> WaitlistLine:
    """How many learners wait in the section besides ``learner_ref``, and where they
    stand themselves (one statement; all zero and None without a waitlist)."""
    mine = Q(learner_ref=learner_ref)
    waiting = Q(state=WaitlistEntry.State.WAITING)
    line = WaitlistEntry.objects.filter(
        section_id=section_id,
        state__in=(WaitlistEntry.State.WAITING, WaitlistEntry.State.OFFERED),
    ).aggregate(
        waiting=Count("pk", filter=waiting & ~mine),
        own_waiting_id=Max("pk", filter=waiting & mine),
        offer_hold_id=Max("offer_hold_id", filter=mine & Q(state=WaitlistEntry.State.OFFERED)),
    )
    return WaitlistLine(**line)


def _ensure_room(section: Section, now: datetime, *, excluding: int | None = None,
                 waiting: int = 0) -> None:
    """Refuse unless a seat is free beyond one for each learner ``waiting``.

    Not "refuse while anyone waits": a section with more free seats than learners
    waiting (an offer outstanding while the next seats freed found nobody waiting) would
    then refuse everyone, and join_waitlist would refuse them too (there is room).
    Counting the waiting learners against the free seats keeps the two exact
    complements: a learner can always either hold a seat or join the line.
    """
    taken = seats_taken(section.pk, now, excluding=excluding)
    if taken >= section.capacity:
        raise SectionFull(section.pk, section.capacity)
    if taken + waiting >= section.capacity:
        raise WaitlistAhead(section.pk, section.capacity, waiting)


def _locked_section_of_hold(hold_id: int) -> Section:
    section = locked_section_of(SeatHold, hold_id)
    if section is None:
        raise HoldNotFound(hold_id)
    return section


def _locked_hold(hold_id: int) -> SeatHold:
    hold = SeatHold.objects.select_for_update().filter(pk=hold_id).first()
    if hold is None:
        raise HoldNotFound(hold_id)
    return hold


def reminder_due(expires_at: datetime) -> datetime:
    """When the reminder of a hold expiring at ``expires_at`` is due."""
    return expires_at - reminder_lead()


def reminder_lead() -> timedelta:
    return timedelta(minutes=conf.REMINDER_LEAD_MINUTES)


def _remind_again(hold: SeatHold, now: datetime) -> None:
    """After a renewal: a reminder not sent (pending, ready, being sent, failed, or
    cancelled because the hold expired first) is due again before the new expiry, a new
    reminder with attempts of its own; a hold that has none (it expired before reminders
    existed) gets one. A sent one stays sent: the learner was reminded. Moving one being
    sent ends its sender's claim: the mail may still leave, but the sender's record of it
    no longer matches (reservations.reminders). The caller holds the hold's row lock, so
    two renewals cannot both create one."""
    reminder = Reminder.objects.filter(hold_id=hold.pk)
    moved = reminder.exclude(state=Reminder.State.SENT).update(
        due_at=reminder_due(hold.expires_at), state=Reminder.State.PENDING, ready_at=None,
        claimed_at=None, attempts=0, failure="", last_error="", updated_at=now)
    if not moved and not reminder.exists():
        Reminder.for_hold(hold, reminder_due(hold.expires_at), now).save()


def _unsent_reminder(hold: SeatHold):
    # One being sent too: its sender's record then no longer matches it.
    return Reminder.objects.filter(hold_id=hold.pk, state__in=(
        Reminder.State.PENDING, Reminder.State.READY, Reminder.State.SENDING))


def _window() -> timedelta:
    return timedelta(minutes=conf.HOLD_MINUTES)
