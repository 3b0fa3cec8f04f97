"""State changes of the ledger that several services share."""

from __future__ import annotations

import json
from typing import Any

import structlog
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from cleanup.models import Chunk, OrphanMessage, Run

log = structlog.get_logger("cleanup.ledger")


def settle_run(run_id) -> Run:
    """Bring a run's state in line with its chunks; a cancelled run stays cancelled.

    Running while any chunk is unfinished; then completed, or completed with dead
    letters. Locking the run row serialises the last chunks of a run: a chunk
    committing at the same moment waits here, then its count sees this one's commit.
    """
    run = Run.objects.select_for_update().get(pk=run_id)
    if run.state == Run.State.CANCELLED:
        return run
    chunks = Chunk.objects.filter(run_id=run_id)
    if chunks.filter(state__in=Chunk.UNFINISHED).exists():
        state = Run.State.RUNNING
    elif chunks.filter(state=Chunk.State.DEAD_LETTERED).exists():
        state = Run.State.COMPLETED_WITH_DEAD_LETTERS
    else:
        state = Run.State.COMPLETED
    if state != run.state:
        run.state = state
        run.finished_at = None if state == Run.State.RUNNING else timezone.now()
        run.save(update_fields=["state", "finished_at"])
        log.info("run settled", run_id=str(run.id), policy=run.policy, state=str(state))
    return run


def dead_letter(chunk: Chunk, reason: str, failure_class: str) -> bool:
    """Dead-letter an unfinished chunk with the class of its failure; return False if it
    had already finished."""
    with transaction.atomic():
        updated = Chunk.objects.filter(pk=chunk.pk, state__in=Chunk.UNFINISHED).update(
            state=Chunk.State.DEAD_LETTERED,
            dead_lettered_at=timezone.now(),
            last_error=reason,
            failure_class=failure_class,
            dead_letters=F("dead_letters") + 1,
        )
        if updated:
            settle_run(chunk.run_id)
    if updated:
        log.warning(
            "chunk dead-lettered",
            run_id=str(chunk.run_id),
            chunk_id=chunk.seq,
            policy=chunk.run.policy,
            outcome="dead_lettered",
            failure_class=failure_class,
            reason=reason.splitlines()[0] if reason else "",
        )
    return bool(updated)


def record_orphan(raw: Any, reason: str, *, run_id: str | None = None,
                  chunk_id: int | None = None) -> OrphanMessage:
    """Keep a message no chunk took, with its raw text and what it named."""
    try:
        text = raw if isinstance(raw, str) else json.dumps(raw, default=repr)
    except (TypeError, ValueError):
        text = repr(raw)
    orphan = OrphanMessage.objects.create(raw=text, error=reason, run_id=run_id,
                                          chunk_id=chunk_id)
    log.warning("orphan message dead-lettered", policy="unknown", outcome="dead_lettered",
                orphan_id=orphan.pk, run_id=run_id, chunk_id=chunk_id, reason=reason)
    return orphan
