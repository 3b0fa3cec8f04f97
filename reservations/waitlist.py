"""The waitlists of full sections: learners join and leave them, and each freed seat is
offered to the first learner waiting, once.

A seat is freed when a held seat is deleted: by cleanup's chunk (it expired) or by the
learner (``release_hold``). The database writes a ``reservations.seat_freed`` event in that DELETE's
own transaction when the section has a waitlist (the trigger of migration 0008), and
the outbox's publisher calls ``offer_freed_seat`` with it, once, in the transaction that
marks it delivered: the offer (a hold with its own window, RESERVATIONS_OFFER_MINUTES),
the entry's move to offered, the record of what the seat produced (FreedSeat, keyed by
the event) and the record of the mail (OfferMail, keyed by its Message-ID) commit
together with "delivered", or none of them does.

The mail leaves before that commit. A publisher that dies after it sends it again when
the event is taken again, under the same Message-ID (made from the event and the
entry), so a provider can drop the copy and the record stays one row.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import parseaddr

import structlog
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.mail import EmailMessage
from django.core.validators import validate_email
from django.db import connection
from django.db.models import Q
from django.utils import timezone

from cleanup import Event
from reservations.conf import conf
from reservations.exceptions import (
    AlreadySeated,
    NotAMailAddress,
    SeatAvailable,
    WaitlistEntryNotFound,
)
from reservations.models import FreedSeat, OfferMail, SeatHold, Section, WaitlistEntry
from reservations.services import (
    create_hold,
    learner_transaction,
    locked_section_of,
    locked_sections,
    seats_taken,
)

log = structlog.get_logger("reservations.waitlist")

# Not the bare "seat.freed" of the engine's docs: the engine's own tests use that name
# for events of their own and register_handler() handlers for it (tests/outbox/test_outbox.py,
# in subprocesses too), which with a handler registered at start-up would make two
# (cleanup.E043).
# Named for the app, the product's event can never collide with an example's.
SEAT_FREED = "reservations.seat_freed"
IN_LINE = (WaitlistEntry.State.WAITING, WaitlistEntry.State.OFFERED)


@learner_transaction
def join_waitlist(section_id: int, learner_ref: str, *,
                  now: datetime | None = None) -> WaitlistEntry:
    """Put a learner at the back of a full section's waitlist; their entry if they are
    in line already. Refused when a seat is free for them (SeatAvailable: hold it
    instead) or when they hold a seat in the section already (AlreadySeated)."""
    address = learner_address(learner_ref)
    try:
        validate_email(address)
    except ValidationError:
        raise NotAMailAddress(learner_ref, address) from None
    # The section's lock: hold_seat and release_hold take it too, so a seat is either
    # free when this looks (refused) or its release sees this entry.
    section = locked_sections().get(pk=section_id)
    now = now or timezone.now()
    # Then the section's held seats, key-share locked (a DELETE waits for that, an
    # UPDATE of an expiry does not): a chunk deleting one of them now (cleanup takes no
    # section lock) has either committed (the seat reads as free below: refused), or
    # waits until this entry commits, so its trigger sees it (or skips the seat for its
    # next run).
    _lock_held_seats(section.pk)
    entry = WaitlistEntry.objects.filter(section=section, learner_ref=learner_ref,
                                         state__in=IN_LINE).first()
    if entry is not None:
        return entry
    taken = SeatHold.objects.filter(section=section, learner_ref=learner_ref).filter(
        Q(status=SeatHold.Status.CONFIRMED)
        | Q(status=SeatHold.Status.HELD, expires_at__gt=now))
    if taken.exists():
        raise AlreadySeated(section.pk, learner_ref)
    waiting = WaitlistEntry.objects.filter(
        section=section, state=WaitlistEntry.State.WAITING).count()
    # The complement of hold_seat's rule: a seat free beyond one for each learner
    # waiting is this learner's to hold.
    if seats_taken(section.pk, now) + waiting < section.capacity:
        raise SeatAvailable(section.pk)
    return WaitlistEntry.objects.create(section=section, learner_ref=learner_ref,
                                        joined_at=now)


# Locks that a DELETE of the row waits for and an UPDATE of its expiry does not.
HELD_SEATS = """
SELECT id FROM reservations_seathold
WHERE section_id = %s AND status = 'held'
ORDER BY id
FOR KEY SHARE
"""


def _lock_held_seats(section_id: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(HELD_SEATS, [section_id])


@learner_transaction
def leave_waitlist(entry_id: int) -> WaitlistEntry:
    """Take a learner out of line; an offer they had is released, so the seat goes to
    the next learner (its event). Leaving twice, or after the line, changes nothing."""
    # The section, then the entry, then the offer's hold: the one order. The entry is
    # read under both locks, never before: an offer committed in between would
    # otherwise name a hold this locks last while its learner, declining, holds it.
    locked_section_of(WaitlistEntry, entry_id)
    entry = WaitlistEntry.objects.select_for_update().filter(pk=entry_id).first()
    if entry is None:
        raise WaitlistEntryNotFound(entry_id)
    if entry.state not in IN_LINE:
        return entry
    offered = entry.state == WaitlistEntry.State.OFFERED
    entry.state = WaitlistEntry.State.LEFT
    entry.save(update_fields=["state"])
    if offered:
        # After the entry left: with nobody else in line the trigger writes no event
        # and the seat is simply free; with others, its event offers it on.
        SeatHold.objects.filter(pk=entry.offer_hold_id,
                                status=SeatHold.Status.HELD).delete()
    return entry


def offer_freed_seat(event: Event) -> None:
    """The ``reservations.seat_freed`` handler: lapse the offer the freed hold was, then offer the
    seat to the first learner waiting, or record that nobody was; once per event."""
    key = event.dedup_id
    if FreedSeat.objects.filter(event_key=key).exists():
        return  # handled already: this event's effects committed, or are in this transaction
    hold_id, section_id = event.payload["hold_id"], event.payload["section_id"]
    # The section, then its entries, then the offer's new hold: the learners' order.
    section = locked_sections().filter(pk=section_id).first()
    if section is None:
        return  # the section was deleted, its waitlist with it: nothing to offer
    now = timezone.now()
    # An offer hold that expired (cleanup) or was released: its learner's turn is over.
    WaitlistEntry.objects.filter(section=section, state=WaitlistEntry.State.OFFERED,
                                 offer_hold_id=hold_id).update(state=WaitlistEntry.State.LAPSED)
    entry = _first_waiting(section, now)
    if entry is None:
        outcome = FreedSeat.Outcome.NOBODY_WAITING
    elif seats_taken(section.pk, now) >= section.capacity:
        # Someone took the seat first (a hold that had expired, renewed before cleanup
        # reached it): recorded, the learner stays first in line.
        outcome, entry = FreedSeat.Outcome.NO_ROOM, None
    else:
        outcome = FreedSeat.Outcome.OFFERED
    # The event's key is unique: were this event ever handled twice at once, the second
    # would fail here and roll back its offer with it.
    FreedSeat.objects.create(event_key=key, section=section, hold_id=hold_id,
                             outcome=outcome, entry=entry, recorded_at=now)
    if outcome == FreedSeat.Outcome.OFFERED:
        _offer(section, entry, event, now)
    log.info("freed seat", section=section.pk, hold=hold_id, outcome=str(outcome),
             entry=entry.pk if entry else None, source=event.source)


def offer_window() -> timedelta:
    return timedelta(minutes=conf.OFFER_MINUTES)


def learner_address(learner_ref: str) -> str:
    return conf.LEARNER_EMAIL.format(learner_ref=learner_ref)


def offer_message_id(event: Event, entry: WaitlistEntry) -> str:
    """The Message-ID of the mail offering the seat ``event`` freed to ``entry``: the
    same on every delivery of the event, another for another learner."""
    domain = parseaddr(settings.DEFAULT_FROM_EMAIL)[1].rpartition("@")[2] or "localhost"
    return f"<seat-offer-{event.pk}-{entry.pk}@{domain}>"


def _first_waiting(section: Section, now: datetime) -> WaitlistEntry | None:
    """The first learner waiting, locked (waiting for a learner leaving at this moment,
    never skipping them); one who holds a seat in the section by now leaves the line
    rather than get a second."""
    while True:
        entry = (WaitlistEntry.objects.select_for_update(skip_locked=False)
                 .filter(section=section, state=WaitlistEntry.State.WAITING)
                 .order_by("joined_at", "pk").first())
        if entry is None:
            return None
        seated = SeatHold.objects.filter(section=section, learner_ref=entry.learner_ref).filter(
            Q(status=SeatHold.Status.CONFIRMED)
            | Q(status=SeatHold.Status.HELD, expires_at__gt=now))
        if not seated.exists():
            return entry
        entry.state = WaitlistEntry.State.LEFT
        entry.save(update_fields=["state"])


def _offer(section: Section, entry: WaitlistEntry, event: Event, now: datetime) -> None:
    hold = create_hold(section, entry.learner_ref, expires_at=now + offer_window(), now=now)
    entry.state = WaitlistEntry.State.OFFERED
    entry.offered_at = now
    entry.offer_hold_id = hold.pk
    entry.offer_event_key = event.dedup_id
    entry.save(update_fields=["state", "offered_at", "offer_hold_id", "offer_event_key"])
    message_id = offer_message_id(event, entry)
    # Last, after every write: a write that fails sends no mail. A failed send raises,
    # the publisher rolls all of it back and takes the event again after its back-off.
    _mail(section, entry, hold.expires_at, message_id).send()
    OfferMail.objects.get_or_create(message_id=message_id,
                                    defaults={"entry": entry, "sent_at": now})


def _mail(section: Section, entry: WaitlistEntry, until: datetime,
          message_id: str) -> EmailMessage:
    until_text = until.astimezone(UTC).strftime("%H:%M UTC")
    return EmailMessage(
        subject=f"A seat in {section.title} is yours until {until_text}",
        body=(f"A seat in {section.title} is yours until {until_text}. Confirm it before "
              "then, or it goes to the next learner."),
        to=[learner_address(entry.learner_ref)],
        headers={"Message-ID": message_id},
    )
