"""Accounts, their leases, and the log of expired leases: just enough for the engine.

A lease lapses at ``expires_at`` (the observed field) unless renewed (``expires_at``
moved on) or kept (``state``); ``account`` partitions range chunks; ``notice`` is what
the update policy moves.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone


class Account(models.Model):
    name = models.CharField(max_length=100, unique=True)

    def __str__(self) -> str:
        return self.name


class Lease(models.Model):
    """Nothing points at it with a cascade and nothing listens to its delete signals:
    each chunk's DELETE stays one statement (system check cleanup.E004)."""

    class State(models.TextChoices):
        ACTIVE = "active", "Active"
        KEPT = "kept", "Kept"

    class Notice(models.TextChoices):
        PENDING = "pending", "Pending"
        DUE = "due", "Due"

    account = models.ForeignKey(Account, on_delete=models.CASCADE, related_name="+")
    holder = models.CharField(max_length=100)
    state = models.CharField(max_length=10, choices=State.choices, default=State.ACTIVE)
    expires_at = models.DateTimeField()
    notice = models.CharField(max_length=10, choices=Notice.choices, default=Notice.PENDING)
    noticed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["expires_at", "id"], condition=Q(state="active"),
                         name="lease_active_by_expiry"),
            models.Index(fields=["account", "id"], name="lease_account_id"),
        ]

    def __str__(self) -> str:
        return f"lease {self.pk} ({self.state})"


class LeaseLog(models.Model):
    """One expired lease, recorded as its chunk deleted it; purged after retention.

    ``lease_id`` is a plain column: a foreign key would make each lease delete cascade.
    """

    account = models.ForeignKey(Account, on_delete=models.CASCADE, related_name="+")
    lease_id = models.BigIntegerField()
    recorded_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["account", "id"], name="leaselog_account_id")]

    def __str__(self) -> str:
        return f"log {self.pk} of lease {self.lease_id}"


class EventEffect(models.Model):
    """What an outbox handler wrote: one row per event, its key unique, so a second
    delivery of one event fails instead of counting twice (tests/test_outbox*.py)."""

    event_key = models.CharField(max_length=255, unique=True)
    event_id = models.BigIntegerField()
    ordering_key = models.CharField(max_length=255, blank=True)
    publisher = models.CharField(max_length=100, blank=True)

    def __str__(self) -> str:
        return f"effect of event {self.event_id}"
