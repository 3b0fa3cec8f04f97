"""A run that mostly fails halts its policy itself, until an operator resumes it.

A chunk that fails for good is dead-lettered and the run goes on, so one bad row never
stops the work. But a predicate the database rejects, or a table locked for an hour,
fails every chunk alike: the run would dead-letter chunk after chunk to the end of its
backlog. So each dead letter weighs the run's last ``CLEANUP_FAILING_CHUNKS`` ended
chunks (committed or dead-lettered); once more than half of them were dead-lettered,
the policy is halted with reason ``failing`` and the failures' most common cause. The
run stays running where it stopped; the chunks in flight finish. Only an operator's
resume ends the halt (cleanup.engine.operations), and the chunks ended before it are
not weighed again, so the run goes on from there and halts again only if it fails
again.
"""

from __future__ import annotations

from collections import Counter

import structlog
from django.db.models import Exists, OuterRef, Subquery
from django.db.models.functions import Coalesce

from cleanup.conf import conf
from cleanup.engine import halts
from cleanup.models import Chunk, Halt, Run

log = structlog.get_logger("cleanup.failing")

ENDED = (*Chunk.DONE, Chunk.State.DEAD_LETTERED)


def weigh(run_id) -> Halt | None:
    """After one of the run's chunks was dead-lettered, in the same transaction: halt
    the run's policy if more than half of the run's last chunks were; return the halt
    opened (None: it goes on, or it was halted for failing already)."""
    # The run's policy, whether it is halted for failing now, and when it was last
    # resumed from that: one statement (a dead letter's transaction stays short).
    failing = Halt.objects.filter(policy=OuterRef("policy"), reason=Halt.FAILING)
    run = Run.objects.filter(pk=run_id).values("policy").annotate(
        halted=Exists(failing.filter(ended_at__isnull=True)),
        resumed=Subquery(failing.filter(ended_at__isnull=False).order_by("-ended_at")
                         .values("ended_at")[:1]),
    ).get()
    if run["halted"]:
        return None
    policy, resumed, weighed = run["policy"], run["resumed"], conf.FAILING_CHUNKS
    chunks = Chunk.objects.filter(run_id=run_id, state__in=ENDED)
    last = list(chunks.alias(ended_at=Coalesce("dead_lettered_at", "committed_at"))
                .filter(**({"ended_at__gt": resumed} if resumed else {}))
                .order_by("-ended_at").values_list("state", "cause")[:weighed])
    causes = [cause for state, cause in last if state == Chunk.State.DEAD_LETTERED]
    if len(causes) * 2 <= weighed:
        return None
    cause, alike = Counter(causes).most_common(1)[0]
    detail = (f"run {run_id}: {len(causes)} of its last {len(last)} chunks were "
              f"dead-lettered, {alike} of them for: {cause or 'no cause recorded'}")
    halt = halts.begin(policy, Halt.FAILING, detail=detail, cause=cause, value=len(causes),
                       limit=weighed / 2, actor="engine")
    if halt is None:
        return None  # a chunk of another of its runs halted it a moment ago
    log.error("policy failing: halted until resumed", policy=policy, run_id=str(run_id),
              dead_lettered=len(causes), weighed=len(last), cause=cause)
    return halt
