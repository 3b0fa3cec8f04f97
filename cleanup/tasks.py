"""Queue entry points for django-q2; each unpacks its arguments and calls one service."""

from __future__ import annotations

from datetime import datetime

from cleanup.dispatch import dispatch
from cleanup.models import Run
from cleanup.worker import apply_chunk as apply_chunk_message


def apply_chunk(message) -> str:
    """Apply one chunk message; returning means its outcome committed."""
    return str(apply_chunk_message(message))


def dispatch_scheduled(policy: str, scheduled_for: str) -> str:
    """Start the run of one schedule slot; the slot is the dispatch key."""
    slot = datetime.fromisoformat(scheduled_for)
    result = dispatch(
        policy, key=schedule_key(policy, slot), trigger=Run.Trigger.SCHEDULE
    )
    return str(result.run.id)


def schedule_key(policy: str, slot: datetime) -> str:
    return f"schedule:{policy}:{slot.isoformat()}"
