"""Re-send chunks whose message was never sent or has been lost.

With the ORM broker a run's messages commit with it and an unacknowledged message
comes back after its redelivery window. With another broker (Redis) messages are sent after the
commit and a message taken by a worker that died is gone; a purged queue loses them
too. Both leave chunks unfinished and silent, which is what this looks for. A
spurious re-send is harmless: the conditional DELETE makes it a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import structlog
from django.db import transaction
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone
from django_q.brokers import get_broker

from cleanup.engine import transitions, transport, window
from cleanup.engine.transport import redelivery_window
from cleanup.models import Chunk, Run
from cleanup.policies import Policy, find_policy

log = structlog.get_logger("cleanup.reconcile")

BATCH = 500


@dataclass(frozen=True)
class ReconcileResult:
    resent: int
    never_sent: int
    planned: int = 0  # chunks planned for runs whose window had room nobody filled


def reconcile(now: datetime | None = None) -> ReconcileResult:
    """Re-send unfinished chunks of running runs that were silent for a whole redelivery window.

    Only once the queue has drained, and each chunk at most once per redelivery window, so a long
    queue is never flooded with copies; chunks a delivery holds right now are skipped.
    """
    now = now or timezone.now()
    planned = _top_up_windows()
    silent_since = now - redelivery_window()
    if get_broker().queue_size():
        # Messages are still waiting: silence may be a backlog, not a loss. Re-sending
        # now would pile copies on the queue; once it drains, the lost ones show.
        return ReconcileResult(0, 0, planned)
    with transaction.atomic():
        chunks = list(
            Chunk.objects.select_for_update(of=("self",), skip_locked=True)
            .filter(state__in=Chunk.UNFINISHED, run__state=Run.State.RUNNING)
            .alias(last_seen=Greatest(
                Coalesce("last_delivery_at", "planned_at"),
                Coalesce("enqueued_at", "planned_at"),
                Coalesce("reconciled_at", "planned_at"),
            ))
            .filter(last_seen__lt=silent_since)
            .order_by("pk")[:BATCH]
        )
        never_sent = [c.pk for c in chunks if c.state == Chunk.State.PLANNED]
        transitions.planned_to_enqueued(never_sent, now)
        transitions.count_reconciled([c.pk for c in chunks], now)
        transport.send(chunks)
    for chunk in chunks:
        log.warning("chunk re-sent by the reconciler", run_id=str(chunk.run_id),
                    chunk_id=chunk.chunk_id, state=chunk.state)
    return ReconcileResult(len(chunks), len(never_sent), planned)


def _top_up_windows() -> int:
    """Plan for runs still planning whose window has room: a chunk's end normally does
    it, but planning can fail after the chunk's outcome committed (it is kept apart so
    the outcome still commits)."""
    planned = 0
    policies = (Run.objects.filter(state=Run.State.RUNNING, planned_all=False)
                .values_list("policy", flat=True).distinct().order_by("policy"))
    for policy in _registered(policies):
        try:
            topped = window.top_up_now(policy)
        except Exception as exc:  # noqa: BLE001 - one policy must not stop the re-sends
            log.error("topping up the window failed", policy=policy.name, error=str(exc))
            continue
        if topped:
            log.warning("window topped up by the reconciler", policy=policy.name,
                        chunks=topped)
        planned += topped
    return planned


def _registered(names) -> list[Policy]:
    """The policies of these names still registered (a deploy may have removed one)."""
    return [policy for name in names if (policy := find_policy(name)) is not None]
