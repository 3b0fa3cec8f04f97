"""The queue's entry point of the publisher (a django-q2 schedule names it)."""

from __future__ import annotations

from cleanup.outbox.publisher import publish

# Events one task delivers at most; the next scheduled task takes the rest.
TASK_BATCH = 1_000


def publish_events(batch: int = TASK_BATCH) -> dict[str, int]:
    """Deliver the pending events that are due; returns the counts."""
    return publish(batch).as_dict()
