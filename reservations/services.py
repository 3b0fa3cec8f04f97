"""Hold, renew, confirm and release seats; each takes the row lock it needs.

Each keeps the hold's renewal reminder in step, in the same transaction: a hold gets
one when it is made, a renewal moves it, a confirmation cancels it, and releasing the
hold deletes it with the hold (in the database). Seats are counted against the
section's waitlist too (reservations.waitlist): learners waiting come first.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Count, Max, Q
from django.utils import timezone

from reservations.conf import conf
from reservations.exceptions import HoldNotFound, HoldNotRenewable, SectionFull, WaitlistAhead
from reservations.models import Reminder, SeatHold, Section, WaitlistEntry


def hold_seat(section_id: int, learner_ref: str, *, now: datetime | None = None) -> SeatHold:
    """Hold a seat for the hold window; refuse when the section is full, or when its free
    seats are spoken for by learners on its waitlist (WaitlistAhead).

    A learner offered a seat from the waitlist gets their offer hold back (the seat is
    theirs already, not a second one); a learner still waiting who takes a seat left
    over beyond everyone else waiting leaves the waitlist.
    """
    now = now or timezone.now()
    with transaction.atomic():
        # The section lock serialises seat counting, so two learners cannot both
        # take the last seat.
        section = Section.objects.select_for_update().get(pk=section_id)
        line = waitlist_line(section.pk, learner_ref)
        if line.offer_hold_id is not None:
            offer = SeatHold.objects.filter(pk=line.offer_hold_id, status=SeatHold.Status.HELD,
                                            expires_at__gt=now).first()
            if offer is not None:
                return offer
        _ensure_room(section, now, waiting=line.waiting)
        hold = create_hold(section, learner_ref, expires_at=now + _window(), now=now)
        if line.own_waiting_id is not None:
            WaitlistEntry.objects.filter(pk=line.own_waiting_id,
                                         state=WaitlistEntry.State.WAITING).update(
                state=WaitlistEntry.State.LEFT)
        return hold


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


def renew_hold(hold_id: int, *, now: datetime | None = None) -> SeatHold:
    """Move a held seat's expiry forward.

    Allowed while the hold still exists and is held, even past its expiry (cleanup
    may not have reached it yet), if the section still has room: an expired hold
    stopped counting against capacity, so it is counted anew.
    """
    now = now or timezone.now()
    with transaction.atomic():
        hold = _locked_hold(hold_id)
        if hold.status != SeatHold.Status.HELD:
            raise HoldNotRenewable(hold_id, hold.status)
        if hold.expires_at <= now:
            section = Section.objects.select_for_update().get(pk=hold.section_id)
            _ensure_room(section, now, excluding=hold.pk,
                         waiting=waitlist_line(section.pk, hold.learner_ref).waiting)
        hold.expires_at = now + _window()
        hold.updated_at = now
        hold.save(update_fields=["expires_at", "updated_at"])
        _remind_again(hold, now)
        return hold


def confirm_hold(hold_id: int, *, now: datetime | None = None) -> SeatHold:
    """Turn a hold into a confirmed seat; confirming twice is harmless."""
    now = now or timezone.now()
    with transaction.atomic():
        hold = _locked_hold(hold_id)
        if hold.status == SeatHold.Status.CONFIRMED:
            return hold
        if hold.expires_at <= now:
            section = Section.objects.select_for_update().get(pk=hold.section_id)
            _ensure_room(section, now, excluding=hold.pk,
                         waiting=waitlist_line(section.pk, hold.learner_ref).waiting)
        hold.status = SeatHold.Status.CONFIRMED
        hold.updated_at = now
        hold.save(update_fields=["status", "updated_at"])
        _unsent_reminder(hold).update(state=Reminder.State.CANCELLED, claimed_at=None,
                                      updated_at=now)
        # A seat offered from the waitlist: its learner is through the line.
        WaitlistEntry.objects.filter(offer_hold_id=hold.pk,
                                     state=WaitlistEntry.State.OFFERED).update(
            state=WaitlistEntry.State.CONFIRMED)
        return hold


def release_hold(hold_id: int) -> bool:
    """Give a held seat back at once (the learner's own action); False if already gone.

    Scheduled cleanup is only the backstop for holds nobody released. The database
    deletes the hold's reminder with it, and writes its ``reservations.seat_freed``
    event when the section has a waitlist (migration 0008).
    """
    with transaction.atomic():
        # The hold's lock first, then the section's: the order renew_hold and
        # confirm_hold take them in, so the three never deadlock.
        hold = (SeatHold.objects.select_for_update().filter(pk=hold_id)
                .values_list("status", "section_id").first())
        if hold is None:
            return False
        status, section_id = hold
        if status != SeatHold.Status.HELD:
            raise HoldNotRenewable(hold_id, status)
        # The section's lock, so that join_waitlist either sees the seat free (and
        # refuses: hold it instead) or commits its entry before this DELETE's trigger
        # looks for a waitlist: a learner joining while a seat is released is never
        # left waiting beside a free seat with no event to offer it.
        list(Section.objects.select_for_update().filter(pk=section_id).values_list("pk"))
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
