"""Queue entry points for django-q2; each unpacks its arguments and calls one service."""

from __future__ import annotations

from datetime import datetime

from cleanup.engine import reconcile, window
from cleanup.engine.worker import apply_chunk as apply_chunk_message
from cleanup.observability import health
from cleanup.outbox import publish
from cleanup.scheduling.schedules import dispatch_slot

# Events one publish_events task delivers at most; the next scheduled task takes the rest.
PUBLISH_BATCH = 1_000


def apply_chunk(message) -> str:
    """Apply one chunk message; returning means its outcome committed."""
    return str(apply_chunk_message(message))


def dispatch_scheduled(policy: str, scheduled_for: str) -> str | None:
    """Start the run of one schedule slot; the slot is the dispatch key."""
    run = dispatch_slot(policy, datetime.fromisoformat(scheduled_for))
    return str(run.id) if run else None


def reconcile_chunks() -> int:
    """Re-send chunks that were never sent or whose message was lost."""
    return reconcile.reconcile().resent


def recheck_pressure(policy: str) -> int:
    """Look again at a policy the database's pressure halts; plan once it clears."""
    return window.recheck(policy)


def fold_counters() -> int:
    """Retired: the totals are counted as each change commits. Kept importable, so a
    schedule or a task an earlier release left behind still runs (and does nothing)
    until cleanup_schedule removes it."""
    return 0


def publish_events() -> dict[str, int]:
    """Deliver the outbox's pending events that are due (at most a batch of them)."""
    return publish(PUBLISH_BATCH).as_dict()


def heartbeat() -> int:
    """Prove that a worker of this cluster takes work; returns its pid."""
    return health.beat().pid
