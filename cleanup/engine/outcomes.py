"""A chunk's end, in the caller's transaction: the transition, then the policy's window
topped up, then the run settled.

Whatever ends a chunk (its commit, its dead letter, an operator's discard or cancel)
comes through here, so the frontier advances whatever one chunk's fate and a run is
completed by the transaction that finished its last chunk. The transitions themselves
(cleanup.engine.transitions) know nothing of the window; the window
(cleanup.engine.window) knows nothing of how chunks end.
"""

from __future__ import annotations

from collections.abc import Iterable

import structlog
from django.db import transaction

from cleanup.engine import failing, transitions, window
from cleanup.models import Chunk, Run

log = structlog.get_logger("cleanup.ledger")


def commit(chunk: Chunk, *, deleted: int, retries: int, elapsed: float,
           updated: int = 0, locked: int = 0, cpu_wait: float | None = None,
           policy: str | None = None, delivery: int | None = None) -> bool:
    """``transitions.commit``, then the window topped up and the run settled
    (``policy``: the run's, where the caller knows it)."""
    committed = transitions.commit(chunk, deleted=deleted, retries=retries, elapsed=elapsed,
                                   updated=updated, locked=locked, cpu_wait=cpu_wait,
                                   delivery=delivery)
    if committed:
        advance_and_settle(chunk.run_id, policy=policy)
    return committed


def dead_letter(chunk: Chunk, reason: str, failure_class: str, *, received: str = "",
                delivery: int | None = None) -> bool:
    """``transitions.dead_letter`` in a savepoint with the top-up and the settling; False
    if the chunk had finished (a committed chunk is never dead-lettered). A run whose
    chunks mostly fail halts its policy first (cleanup.engine.failing), so the top-up
    plans nothing more of it."""
    with transaction.atomic():
        dead = transitions.dead_letter(chunk, reason, failure_class, received=received,
                                       delivery=delivery)
        if dead:
            failing.weigh(chunk.run_id)
            advance_and_settle(chunk.run_id)
    if dead:
        log.warning(
            "chunk dead-lettered",
            **transitions.chunk_fields(chunk),
            outcome="dead_lettered",
            failure_class=failure_class,
            reason=reason.splitlines()[0] if reason else "",
        )
    return dead


def discard(pks: Iterable[int], reason: str) -> list[Chunk]:
    """``transitions.discard``; then each run's window and state, runs in lock order."""
    chunks = transitions.discard(pks, reason)
    for run_id in transitions.in_lock_order({c.run_id for c in chunks}):
        advance_and_settle(run_id)
    return chunks


def cancel_runs(run_ids: Iterable) -> list[tuple[Run, int]]:
    """``transitions.cancel_runs``; the room the runs held goes to their policies' other
    runs once this commits (topping up locks runs under the planning lock, and this
    transaction already holds runs)."""
    cancelled = transitions.cancel_runs(run_ids)
    for policy in sorted({run.policy for run, _ in cancelled}):
        transaction.on_commit(lambda policy=policy: window.top_up_now(policy))
    return cancelled


def advance_and_settle(run_id, *, policy: str | None = None) -> Run:
    """Top the run's policy's window up (in a savepoint: the chunk's end commits even if
    planning fails), then bring the run's state in line with its chunks.

    ``policy`` is the run's policy where the caller has it (a chunk's worker does),
    which saves reading it on every chunk's end."""
    if policy is None:
        policy = Run.objects.filter(pk=run_id).values_list("policy", flat=True).first()
    if policy is not None:
        window.top_up_safely(policy)
    return transitions.settle_run(run_id)
