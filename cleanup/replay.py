"""Replay a run: re-send its chunks with the same cutoff, or start a linked run."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import structlog
from django.db import transaction
from django.utils import timezone

from cleanup.dispatch import dispatch, send
from cleanup.exceptions import UnknownChunk
from cleanup.models import Chunk, Run
from cleanup.status import get_run

log = structlog.get_logger("cleanup.replay")

# Chunks an operator closed on purpose stay closed; a replay skips them.
NOT_RESENT = (Chunk.State.DISCARDED, Chunk.State.CANCELLED)


@dataclass(frozen=True)
class ReplayResult:
    run: Run
    resent: int
    skipped: int
    created: bool = False


def replay(
    run_id,
    *,
    chunk_ids: list[int] | None = None,
    new_cutoff: datetime | None = None,
    trigger: str = Run.Trigger.REPLAY,
) -> ReplayResult:
    """Re-send a run's chunks, or dispatch a new run linked to it with a later cutoff.

    With the same cutoff, committed chunks are re-sent too: their delivery is a no-op.
    A dead-lettered chunk goes back to enqueued and its run reopens.
    """
    run = get_run(run_id)
    if new_cutoff is not None:
        result = dispatch(
            run.policy,
            scheme=run.scheme,
            cutoff=new_cutoff,
            key=f"replay:{run.id}:{new_cutoff.isoformat()}",
            trigger=trigger,
            replay_of=run,
        )
        return ReplayResult(result.run, result.chunks, 0, created=result.created)

    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run.pk)
        chunks = run.chunks.select_for_update().order_by("seq")
        if chunk_ids:
            chunks = chunks.filter(seq__in=chunk_ids)
            missing = sorted(set(chunk_ids) - {c.seq for c in chunks})
            if missing:
                raise UnknownChunk(run.id, missing)
        resend = [c for c in chunks if c.state not in NOT_RESENT]
        requeued = [c.pk for c in resend if c.state == Chunk.State.DEAD_LETTERED]
        if requeued:
            requeue(run, requeued)
        send(resend)
    log.info("run replayed", run_id=str(run.id), policy=run.policy, resent=len(resend),
             requeued=len(requeued), cutoff=run.cutoff.isoformat())
    return ReplayResult(run, len(resend), len(chunks) - len(resend))


def requeue(run: Run, chunk_pks: list[int]) -> None:
    """Put dead-lettered chunks back in the queue's hands and reopen their run.

    Their earlier unfinished deliveries are set aside so the poison limit counts
    afresh; the counters themselves keep adding.
    """
    for chunk in Chunk.objects.filter(pk__in=chunk_pks, state=Chunk.State.DEAD_LETTERED):
        chunk.unfinished_forgiven = chunk.deliveries - chunk.deliveries_completed
        chunk.state = Chunk.State.ENQUEUED
        chunk.enqueued_at = timezone.now()
        chunk.save(update_fields=["unfinished_forgiven", "state", "enqueued_at"])
    if run.state != Run.State.CANCELLED:
        Run.objects.filter(pk=run.pk).update(state=Run.State.RUNNING, finished_at=None)
