"""The outbox: events written in the transaction of the change that caused them, and
delivered once each by the publisher (cleanup.outbox)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone


class Event(models.Model):
    """Something that happened and must be told exactly once: a hold expired, a seat
    was freed.

    ``(name, key)`` is unique: the key deduplicates within one kind of event, so two
    kinds caused by one change (a seat freed, a hold expired, both keyed by the hold)
    never suppress each other, and a second emit of the same event is a no-op. Effects
    outside the database carry ``dedup_id`` (a mail's Message-ID).

    ``run_id`` and ``chunk_id`` are plain columns, not foreign keys: a key to the ledger
    would make every purge of runs cascade, which a policy's one-statement DELETE must
    not (system check cleanup.E004).
    """

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        DELIVERED = "delivered", "Delivered"
        DEAD = "dead", "Dead"
        DISCARDED = "discarded", "Discarded"

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=100)
    key = models.CharField(max_length=255)
    # Events of one ordering key are delivered in id order; "" means unordered.
    ordering_key = models.CharField(max_length=255, blank=True, default="")
    payload = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)  # handler calls that failed
    # Set, and committed, before its handler is called; cleared when the call's outcome
    # is recorded. Found set when the event is taken again: that call never returned
    # (its process died, or lost its connection), and it is counted as a failed attempt.
    call_started_at = models.DateTimeField(null=True, blank=True)
    # Not taken before this: emitted, or the back-off after a failed attempt.
    available_at = models.DateTimeField(default=timezone.now)
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)
    # When it left pending: delivered, dead-lettered or discarded (a requeue clears it).
    settled_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")  # the traceback
    cause = models.CharField(max_length=255, blank=True, default="")  # its one line
    reason = models.TextField(blank=True, default="")  # why an operator discarded it
    source = models.CharField(max_length=100, default="host")  # "run <id> chunk <n>"
    run_id = models.UUIDField(null=True, blank=True)
    chunk_id = models.IntegerField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["name", "key"], name="event_unique_name_key"),
        ]
        indexes = [
            # The head of each ordering key (a skip scan, one probe per key), and "is
            # there an earlier pending event of this key?": only pending rows, so the
            # delivered ones piling up until the purge cost the publisher nothing.
            models.Index(fields=["ordering_key", "id"], condition=Q(state="pending"),
                         name="event_pending_by_key"),
            # Unordered events, the soonest available first.
            models.Index(fields=["available_at", "id"],
                         condition=Q(state="pending", ordering_key=""),
                         name="event_pending_unordered"),
            # The console's search by the start of a key (LIKE 'seathold:4%'): a plain
            # btree serves LIKE only under the C collation.
            models.Index(fields=["key"], opclasses=["varchar_pattern_ops"],
                         name="event_key_prefix"),
            # Dead events by name, for /metrics: a few rows among many delivered.
            models.Index(fields=["name"], condition=Q(state="dead"), name="event_dead"),
            # What the retention purge takes (cleanup.retention), oldest first.
            models.Index(fields=["settled_at"],
                         condition=Q(state__in=["delivered", "discarded"]),
                         name="event_settled"),
        ]

    def __str__(self) -> str:
        return f"event {self.pk} {self.name} {self.key}"

    @property
    def dedup_id(self) -> str:
        """What an effect outside the database carries, the same on every resend."""
        return f"{self.name}/{self.key}"
