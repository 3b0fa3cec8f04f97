"""Replay a run: re-send its chunks with the same cutoff, or start a linked run."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

import structlog
from django.db import transaction

from cleanup.cutoffs import frozen_cutoff
from cleanup.engine import operations
from cleanup.engine.dispatch import dispatch
from cleanup.engine.operations import get_run
from cleanup.engine.transport import send
from cleanup.exceptions import CleanupError
from cleanup.models import Chunk, Run

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
    chunk_ids: Iterable[int] | operations.AllChunks = operations.ALL_CHUNKS,
    new_cutoff: datetime | None = None,
    trigger: str = Run.Trigger.REPLAY,
) -> ReplayResult:
    """Re-send a run's chunks, or dispatch a new run linked to it with a later cutoff.

    With the same cutoff, committed chunks are re-sent too: their delivery is a no-op.
    A dead-lettered chunk goes back to enqueued and its run reopens. ``chunk_ids`` names
    the chunks to re-send (every chunk by default); an empty selection is refused.
    """
    run = get_run(run_id)
    if new_cutoff is not None:
        # The key names the instant, not how it was written: one instant is one replay.
        new_cutoff = frozen_cutoff(new_cutoff, not_before=run.cutoff)
        result = dispatch(
            run.policy,
            scheme=run.scheme,
            cutoff=new_cutoff,
            key=f"replay:{run.id}:{new_cutoff.isoformat()}",
            trigger=trigger,
            replay_of=run,
        )
        return ReplayResult(result.run, result.chunks, 0, created=result.created)

    if run.state == Run.State.CANCELLED:
        raise CleanupError(f"run {run.id} is cancelled; replay it with a new cutoff instead")
    # No lock on the run here: workers lock a chunk, then its run; requeue() below
    # keeps that order, so a replay never deadlocks with a committing chunk.
    with transaction.atomic():
        pks = operations.chunk_pks(run, chunk_ids)
        chunks = list(Chunk.objects.filter(pk__in=pks).exclude(state__in=NOT_RESENT))
        requeued = operations.requeue(
            [c.pk for c in chunks if c.state == Chunk.State.DEAD_LETTERED], resend=False
        )
        send(chunks)
    log.info("run replayed", run_id=str(run.id), policy=run.policy, resent=len(chunks),
             requeued=requeued.done, cutoff=run.cutoff.isoformat())
    return ReplayResult(run, len(chunks), len(pks) - len(chunks))
