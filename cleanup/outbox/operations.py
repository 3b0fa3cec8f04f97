"""An operator's actions on dead events: requeue them, or discard them with a reason.

Each is guarded by the state it leaves, so a second call (or two operators at once)
changes nothing more, and each says which events it changed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.db import transaction
from django.db.models.functions import Now

from cleanup.exceptions import CleanupError
from cleanup.models import Event
from cleanup.outbox import totals


@dataclass(frozen=True)
class EventAction:
    done: int
    skipped: int  # named, but not dead (delivered, pending, discarded, or no such event)
    affected: tuple[int, ...] = ()


def requeue(ids: Iterable[int]) -> EventAction:
    """Dead → pending, available now, attempts kept: one more failure makes it dead
    again. It no longer waits for its ordering key's later events, delivered meanwhile."""
    return _move(ids, state=Event.State.PENDING, available_at=Now(), settled_at=None)


def discard(ids: Iterable[int], reason: str) -> EventAction:
    """Dead → discarded: given up on for good, with the operator's reason."""
    reason = (reason or "").strip()
    if not reason:
        raise CleanupError("a reason is required to discard an event")
    return _move(ids, state=Event.State.DISCARDED, reason=reason, settled_at=Now())


def _move(ids: Iterable[int], **changes) -> EventAction:
    ids = sorted(set(ids))
    with transaction.atomic():
        # Locked in id order, so two operators' actions never deadlock.
        dead = list(Event.objects.select_for_update().filter(pk__in=ids, state=Event.State.DEAD)
                    .order_by("id").values_list("pk", flat=True))
        Event.objects.filter(pk__in=dead, state=Event.State.DEAD).update(**changes)
        if changes["state"] == Event.State.DISCARDED:
            totals.count_settled(dead, Event.State.DISCARDED)
    return EventAction(len(dead), len(ids) - len(dead), tuple(dead))
