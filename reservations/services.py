"""Hold, renew, confirm and release seats; each takes the row lock it needs.

Each keeps the hold's renewal reminder in step, in the same transaction: a hold gets
one when it is made, a renewal moves it, a confirmation cancels it, and releasing the
hold deletes it with the hold (in the database).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from reservations.conf import conf
from reservations.exceptions import HoldNotFound, HoldNotRenewable, SectionFull
from reservations.models import Reminder, SeatHold, Section


def hold_seat(section_id: int, learner_ref: str, *, now: datetime | None = None) -> SeatHold:
    """Hold a seat for the hold window; refuse when the section is full."""
    now = now or timezone.now()
    with transaction.atomic():
        # The section lock serialises seat counting, so two learners cannot both
        # take the last seat.
        section = Section.objects.select_for_update().get(pk=section_id)
        _ensure_room(section, now)
        hold = SeatHold.objects.create(
            tenant_id=section.tenant_id,
            section=section,
            learner_ref=learner_ref,
            expires_at=now + _window(),
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
            _ensure_room(section, now, excluding=hold.pk)
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
            _ensure_room(section, now, excluding=hold.pk)
        hold.status = SeatHold.Status.CONFIRMED
        hold.updated_at = now
        hold.save(update_fields=["status", "updated_at"])
        _unsent_reminder(hold).update(state=Reminder.State.CANCELLED, claimed_at=None,
                                      updated_at=now)
        return hold


def release_hold(hold_id: int) -> bool:
    """Give a held seat back at once (the learner's own action); False if already gone.

    Scheduled cleanup is only the backstop for holds nobody released. The database
    deletes the hold's reminder with it.
    """
    deleted, _ = SeatHold.objects.filter(pk=hold_id, status=SeatHold.Status.HELD).delete()
    if not deleted and SeatHold.objects.filter(pk=hold_id).exists():
        raise HoldNotRenewable(hold_id, SeatHold.Status.CONFIRMED)
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


def _ensure_room(section: Section, now: datetime, *, excluding: int | None = None) -> None:
    if seats_taken(section.pk, now, excluding=excluding) >= section.capacity:
        raise SectionFull(section.pk, section.capacity)


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
