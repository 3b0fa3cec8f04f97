"""Record the broker's acknowledgement of a chunk on its ledger row."""

from __future__ import annotations

import structlog
from django.db import DatabaseError
from django.dispatch import receiver
from django.utils import timezone
from django_q.signals import post_execute

from cleanup import messages
from cleanup.dispatch import CHUNK_TASK
from cleanup.models import Chunk

log = structlog.get_logger("cleanup.receivers")


@receiver(post_execute, dispatch_uid="cleanup.record_acknowledgement")
def record_acknowledgement(sender, task, **kwargs) -> None:
    """Mark a committed chunk acknowledged once django-q2 has acked its message.

    post_execute fires after the ack; a process dying in between leaves the chunk
    committed, which only reads as "awaiting acknowledgement".
    """
    if task.get("func") != CHUNK_TASK or not task.get("success") or not task.get("args"):
        return
    run_id, chunk_id = messages.identify(task["args"][0])
    if run_id is None or chunk_id is None:
        return
    try:
        Chunk.objects.filter(run_id=run_id, seq=chunk_id, state=Chunk.State.COMMITTED).update(
            state=Chunk.State.ACKNOWLEDGED, acknowledged_at=timezone.now()
        )
    except DatabaseError as exc:
        # This runs in django-q2's monitor loop; an error here must not stop it. The
        # chunk stays committed, which reads as "awaiting acknowledgement".
        log.warning("acknowledgement not recorded", run_id=run_id, chunk_id=chunk_id,
                    error=str(exc))
