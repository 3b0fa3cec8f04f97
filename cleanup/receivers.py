"""Record the broker's acknowledgement of a chunk on its ledger row."""

from __future__ import annotations

from django.dispatch import receiver
from django.utils import timezone
from django_q.signals import post_execute

from cleanup import messages
from cleanup.dispatch import CHUNK_TASK
from cleanup.models import Chunk


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
    Chunk.objects.filter(run_id=run_id, seq=chunk_id, state=Chunk.State.COMMITTED).update(
        state=Chunk.State.ACKNOWLEDGED, acknowledged_at=timezone.now()
    )
