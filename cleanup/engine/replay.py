"""Replay a run: re-send its chunks with the same cutoff, or start a linked run."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

import structlog
from django.db import connection, transaction

from cleanup.cutoffs import frozen_cutoff
from cleanup.display import number
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
    the chunks to re-send (every chunk by default); an empty selection is refused, and
    so is a re-send on top of one still in flight (a double submit): nothing is sent.
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
        _one_replay_at_a_time(run)
        pks = operations.chunk_pks(run, chunk_ids)
        chunks = list(Chunk.objects.filter(pk__in=pks).exclude(state__in=NOT_RESENT))
        _refuse_while_resent_in_flight(run, chunks)
        requeued = operations.requeue(
            [c.pk for c in chunks if c.state == Chunk.State.DEAD_LETTERED], resend=False
        )
        send(chunks)
    log.info("run replayed", run_id=str(run.id), policy=run.policy, resent=len(chunks),
             requeued=requeued.done, cutoff=run.cutoff.isoformat())
    return ReplayResult(run, len(chunks), len(pks) - len(chunks))


def _one_replay_at_a_time(run: Run) -> None:
    """Serialise the replays of one run until the transaction ends: a second one (a
    double submit) waits for the first to commit, then sees what it sent. Not the run's
    row lock, which a committing chunk takes after its own."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                       [f"cleanup:replay:{run.pk}"])


def _refuse_while_resent_in_flight(run: Run, chunks: list[Chunk]) -> None:
    """Refuse to re-send chunks still unfinished after the run was re-sent before.

    A re-send (a replay, a requeue, the reconciler) is what the run's sent count holds
    beyond one message per chunk that left ``planned``; while any of the chunks asked for
    is still planned, enqueued or retrying, its message is in the queue, and sending it
    again only doubles the deliveries. The reconciler re-sends those whose message was
    lost, once the queue has drained.
    """
    unfinished = [chunk for chunk in chunks if chunk.state in Chunk.UNFINISHED]
    if not unfinished:
        return
    sent_once = Chunk.objects.filter(run=run).exclude(state=Chunk.State.PLANNED).count()
    sent = Run.objects.filter(pk=run.pk).values_list("messages_sent", flat=True).get()
    if sent <= sent_once:
        return  # never re-sent: this replay is the first
    states = ", ".join(f"{number(n)} {state}" for state, n in sorted(
        Counter(chunk.state for chunk in unfinished).items()))
    raise CleanupError(
        f"run {run.id} was re-sent before and {number(len(unfinished))} of the chunks to "
        f"replay are still in flight ({states}): sending them again would only deliver "
        "them twice, so nothing was sent; replay it once they have finished (the "
        "reconciler re-sends any whose message was lost)")
