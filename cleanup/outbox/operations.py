"""An operator's actions on dead events: requeue them, or discard them with a reason.

Each is guarded by the state it leaves, so a second call (or two operators at once)
changes nothing more, and each says which events it changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from django.db import transaction

from cleanup.exceptions import ActionResult, CleanupError, operator_reason
from cleanup.models import Event
from cleanup.outbox import events

# The range of the event's bigserial id.
EVENT_IDS = range(1, 2**63)


def requeue(ids: Iterable[int]) -> ActionResult:
    """Dead → pending, available now, attempts kept: one more failure makes it dead
    again. It no longer waits for its ordering key's later events, delivered meanwhile."""
    return _move(ids, events.dead_to_pending)


def discard(ids: Iterable[int], reason: str) -> ActionResult:
    """Dead → discarded: given up on for good, with the operator's reason (one line of
    printable text, as a pause's)."""
    reason = operator_reason(reason, "an event's discard",
                             missing="a reason is required to discard an event")
    return _move(ids, lambda dead: events.dead_to_discarded(dead, reason))


def _move(ids: Iterable[int], write: Callable[[list[int]], None]) -> ActionResult:
    """``write`` the events of ``ids`` that are dead; skipped, the others (delivered,
    pending, discarded, or no such event)."""
    ids = list(ids)
    if wrong := [pk for pk in ids if not _event_id(pk)]:
        # Before any SQL: a value out of the column's range aborts the caller's transaction.
        raise CleanupError(f"an event id is a whole number from 1 to {EVENT_IDS.stop - 1}, "
                           f"not {wrong[0]!r:.60}")
    ids = sorted(set(ids))
    with transaction.atomic():
        # Locked in id order, so two operators' actions never deadlock.
        dead = list(Event.objects.select_for_update().filter(pk__in=ids, state=Event.State.DEAD)
                    .order_by("id").values_list("pk", flat=True))
        write(dead)
    return ActionResult(len(dead), len(ids) - len(dead), tuple(dead))


def _event_id(pk: object) -> bool:
    return isinstance(pk, int) and not isinstance(pk, bool) and pk in EVENT_IDS
