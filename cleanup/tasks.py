"""Queue entry points for django-q2; each unpacks its arguments and calls one service.

Every one but a chunk's (bounded in the ledger's functions) runs as a step
(cleanup.engine.steps): a lock held past its bound makes it give up, recorded, and
return what blocked it; its next turn tries again.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TypeVar

from django.utils.module_loading import import_string

from cleanup.engine import reconcile, window
from cleanup.engine.steps import StepBlocked, step
from cleanup.engine.worker import apply_chunk as apply_chunk_message
from cleanup.observability import health
from cleanup.outbox import publish
from cleanup.scheduling.schedules import dispatch_slot, registered_task

T = TypeVar("T")

# Events one publish_events task delivers at most; the next scheduled task takes the rest.
PUBLISH_BATCH = 1_000


def apply_chunk(message) -> str:
    """Apply one chunk message; returning means its outcome committed."""
    return str(apply_chunk_message(message))


def _as_step(name: str, policy: str, call: Callable[[], T]) -> T | str:
    """``call()`` as the step ``name``; what blocked it, in words, if it gave up."""
    try:
        with step(name, policy):
            return call()
    except StepBlocked as blocked:
        return str(blocked)


def dispatch_scheduled(policy: str, scheduled_for: str) -> str | None:
    """Start the run of one schedule slot; the slot is the dispatch key. Blocked, the
    slot stays fired and undispatched, and the next slot tries again."""
    run = _as_step("dispatch", policy,
                   lambda: dispatch_slot(policy, datetime.fromisoformat(scheduled_for)))
    if isinstance(run, str):
        return run  # what blocked it
    return str(run.id) if run else None


def reconcile_chunks() -> int | str:
    """Re-send chunks that were never sent or whose message was lost."""
    return _as_step("reconcile", "", lambda: reconcile.reconcile().resent)


def recheck_pressure(policy: str) -> int | str:
    """Look again at a policy the database's pressure halts; plan once it clears."""
    return _as_step("recheck", policy, lambda: window.recheck(policy))


def run_task(name: str):
    """Run the host's task ``name`` (``register_task``) as a step of that name."""
    return _as_step(name, "", import_string(registered_task(name)))


def fold_counters() -> int:
    """Retired: the totals are counted as each change commits. Kept importable, so a
    schedule or a task an earlier release left behind still runs (and does nothing)
    until cleanup_schedule removes it."""
    return 0


def publish_events() -> dict[str, int] | str:
    """Deliver the outbox's pending events that are due (at most a batch of them)."""
    return _as_step("publish-events", "", lambda: publish(PUBLISH_BATCH).as_dict())


def heartbeat() -> int | str:
    """Prove that a worker of this cluster takes work; returns its pid."""
    return _as_step("heartbeat", "", lambda: health.beat().pid)
