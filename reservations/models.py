"""Tenants, course sections, seat holds, their renewal reminders and the attempts to
send them, and the waitlists of full sections with what each freed seat produced."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone


class Tenant(models.Model):
    """An institution."""

    name = models.CharField(max_length=200, unique=True)

    def __str__(self) -> str:
        return self.name


class Section(models.Model):
    """A course section with a fixed number of seats."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="sections")
    title = models.CharField(max_length=200)
    capacity = models.PositiveIntegerField()

    def __str__(self) -> str:
        return self.title


class SeatHold(models.Model):
    """A learner's temporary (held) or final (confirmed) claim on a seat.

    Nothing may point at this model with a cascading or SET_NULL foreign key, nor
    listen to its delete signals: either would turn cleanup's single conditional
    DELETE into SELECT-then-DELETE-by-pk (system check cleanup.E004).
    """

    class Status(models.TextChoices):
        HELD = "held", "Held"
        CONFIRMED = "confirmed", "Confirmed"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    section = models.ForeignKey(Section, on_delete=models.CASCADE, related_name="+")
    learner_ref = models.CharField(max_length=100)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.HELD)
    expires_at = models.DateTimeField()
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            models.Index(
                fields=["expires_at", "id"],
                condition=Q(status="held"),
                name="seathold_held_by_expiry",
            ),
            models.Index(fields=["tenant", "id"], name="seathold_tenant_id"),
            # Range planning reads each tenant's eligible ids in order from this index
            # alone (an index-only scan): 2.5x faster than through seathold_tenant_id
            # at a million expired holds (docs/performance.md).
            models.Index(
                fields=["tenant", "id"],
                include=["expires_at"],
                condition=Q(status="held"),
                name="seathold_held_by_tenant",
            ),
            # Whole-table range planning numbers the eligible ids in order from this
            # index alone.
            models.Index(
                fields=["id"],
                include=["expires_at"],
                condition=Q(status="held"),
                name="seathold_held_by_id",
            ),
            models.Index(fields=["section", "status"], name="seathold_section_status"),
        ]

    def __str__(self) -> str:
        return f"hold {self.pk} ({self.status})"


class Reminder(models.Model):
    """The renewal reminder of one held seat, due a lead time before the hold expires.

    Cleanup's ``mark-reminders-ready`` policy marks a due pending reminder ready; the
    sender (``reservations.reminders``) claims a ready one (``sending``, at
    ``claimed_at``), mails it, then marks it sent, back to ready after a temporary
    failure, or failed (``failure``, ``last_error``) when it cannot be sent or gave up
    after ``attempts``. Renewing the hold moves ``due_at`` and puts an unsent reminder
    back to pending; confirming it cancels the reminder.

    ``hold`` has no cascade in Django (DO_NOTHING, no constraint), which keeps the hold
    table's single-statement DELETE; a statement-level trigger in the database
    (migrations 0004/0007) deletes, once per DELETE, the reminders whose hold_id is among
    the ids of the holds that statement removed.
    """

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        READY = "ready", "Ready to send"
        SENDING = "sending", "Sending"
        SENT = "sent", "Sent"
        CANCELLED = "cancelled", "Cancelled"
        FAILED = "failed", "Failed"

    class Failure(models.TextChoices):
        REFUSED = "refused", "Refused by the mail server"
        BAD_ADDRESS = "bad_address", "Not a mail address"
        GAVE_UP = "gave_up", "Gave up after the attempts allowed"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    hold = models.OneToOneField(SeatHold, on_delete=models.DO_NOTHING, db_constraint=False,
                                related_name="+")
    learner_ref = models.CharField(max_length=100)
    due_at = models.DateTimeField()
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    ready_at = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    # When the sender last claimed it; also names the claim, so a sender records its
    # outcome only over its own claim (reservations.reminders).
    claimed_at = models.DateTimeField(null=True, blank=True)
    # Sends started since the hold was last renewed.
    attempts = models.PositiveSmallIntegerField(db_default=0)
    failure = models.CharField(max_length=20, choices=Failure.choices, blank=True,
                               db_default="")
    # The last failure's own line: the server's reply, or what went wrong.
    last_error = models.TextField(blank=True, db_default="")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            # Items planning and the backlog's age: pending reminders by due time.
            models.Index(fields=["due_at", "id"], condition=Q(state="pending"),
                         name="reminder_pending_by_due"),
            # Range planning: pending ids in order, from the index alone.
            models.Index(fields=["id"], include=["due_at"], condition=Q(state="pending"),
                         name="reminder_pending_by_id"),
            # The sender takes ready reminders oldest due first.
            models.Index(fields=["due_at", "id"], condition=Q(state="ready"),
                         name="reminder_ready_by_due"),
            # Each run looks for claims that outlived the lease.
            models.Index(fields=["claimed_at"], condition=Q(state="sending"),
                         name="reminder_sending_by_claim"),
            # /metrics counts the failed ones by failure.
            models.Index(fields=["failure"], condition=Q(state="failed"),
                         name="reminder_failed_by_failure"),
        ]

    def __str__(self) -> str:
        return f"reminder {self.pk} for hold {self.hold_id} ({self.state})"

    @classmethod
    def for_hold(cls, hold: SeatHold, due_at, now) -> Reminder:
        """The pending reminder of ``hold``, due at ``due_at`` (not saved)."""
        return cls(tenant_id=hold.tenant_id, hold_id=hold.pk, learner_ref=hold.learner_ref,
                   due_at=due_at, created_at=now, updated_at=now)


class ReminderAttempt(models.Model):
    """A reminder sent to a learner about an expiring hold; purged after retention.

    ``hold_id`` is a plain column, not a foreign key: a relation to SeatHold would make
    every hold delete cascade (see SeatHold).
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    hold_id = models.BigIntegerField()
    learner_ref = models.CharField(max_length=100)
    channel = models.CharField(max_length=20, default="email")
    # When its send began (the sender's claim): the hold as the sender last saw it.
    sent_at = models.DateTimeField(default=timezone.now)
    # The sent message's Message-ID: the same for every send of one reminder's due time.
    message_id = models.CharField(max_length=200, blank=True, db_default="")

    class Meta:
        indexes = [
            models.Index(fields=["tenant", "id"], name="reminder_tenant_id"),
            # The backlog's age (the oldest stale attempt) without a full scan.
            models.Index(fields=["sent_at"], name="reminder_sent_at"),
        ]
        constraints = [
            # One record per message: a claim taken over after its lease ran out may
            # send the same Message-ID again, and that is still one reminder sent.
            models.UniqueConstraint(fields=["message_id"], condition=~models.Q(message_id=""),
                                    name="reminder_attempt_one_per_message"),
        ]

    def __str__(self) -> str:
        return f"reminder {self.pk} about hold {self.hold_id}"


class WaitlistEntry(models.Model):
    """A learner waiting for a seat in a full section, then offered one, until the offer
    is confirmed, lapses, or the learner leaves.

    ``offer_hold_id`` is a plain column, not a foreign key to SeatHold: a relation would
    make cleanup's DELETE of holds cascade (system check cleanup.E004). An offer hold
    that expired or was released is gone; its ``reservations.seat_freed`` event moves the entry to
    lapsed (reservations.waitlist).
    """

    class State(models.TextChoices):
        WAITING = "waiting", "Waiting"
        OFFERED = "offered", "Offered a seat"
        LAPSED = "lapsed", "Offer lapsed"
        CONFIRMED = "confirmed", "Confirmed"
        LEFT = "left", "Left"

    section = models.ForeignKey(Section, on_delete=models.CASCADE, related_name="+")
    learner_ref = models.CharField(max_length=100)
    state = models.CharField(max_length=10, choices=State.choices, default=State.WAITING)
    joined_at = models.DateTimeField(default=timezone.now)
    offered_at = models.DateTimeField(null=True, blank=True)
    offer_hold_id = models.BigIntegerField(null=True, blank=True)
    # The event whose freed seat was offered (Event.dedup_id).
    offer_event_key = models.CharField(max_length=400, blank=True, default="")

    class Meta:
        verbose_name_plural = "waitlist entries"
        constraints = [
            # One place in a section's line per learner while they are in it; after an
            # offer lapsed, or they left, they may join again at the back.
            models.UniqueConstraint(fields=["section", "learner_ref"],
                                    condition=Q(state__in=("waiting", "offered")),
                                    name="waitlist_one_place_per_learner"),
        ]
        indexes = [
            # The first learner waiting in a section, and the trigger's "does anyone
            # wait here?" (migration 0008), from the index alone.
            models.Index(fields=["section", "state", "joined_at", "id"],
                         name="waitlist_line"),
            # confirm_hold finds the entry an offer hold answers.
            models.Index(fields=["offer_hold_id"], condition=Q(state="offered"),
                         name="waitlist_offered_by_hold"),
        ]

    def __str__(self) -> str:
        return f"{self.learner_ref} in line for section {self.section_id} ({self.state})"


class FreedSeat(models.Model):
    """What one freed seat (one ``reservations.seat_freed`` event) produced: an offer,
    nobody waiting, or no room. The event's key is unique, so a second delivery never
    records twice."""

    class Outcome(models.TextChoices):
        OFFERED = "offered", "Offered"
        NOBODY_WAITING = "nobody_waiting", "Nobody waiting"
        NO_ROOM = "no_room", "No room"

    event_key = models.CharField(max_length=400, unique=True)
    section = models.ForeignKey(Section, on_delete=models.CASCADE, related_name="+")
    # The hold whose deletion freed the seat (gone: a plain column).
    hold_id = models.BigIntegerField()
    outcome = models.CharField(max_length=20, choices=Outcome.choices)
    entry = models.ForeignKey(WaitlistEntry, on_delete=models.SET_NULL, null=True,
                              blank=True, related_name="+")
    recorded_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"seat of hold {self.hold_id}: {self.outcome}"


class OfferMail(models.Model):
    """An offer's mail, by its Message-ID: a resend after a crash carries the same id
    and is still one mail on record."""

    message_id = models.CharField(max_length=200, unique=True)
    entry = models.ForeignKey(WaitlistEntry, on_delete=models.CASCADE, related_name="+")
    sent_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.message_id
