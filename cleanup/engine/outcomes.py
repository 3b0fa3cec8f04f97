"""A chunk's outcome, in the caller's transaction: the transition, then the policy's
window topped up, then the run settled.

Whatever ends a chunk (its commit, its dead letter, an operator's discard or cancel)
or brings it back (a requeue) comes through here, so the frontier advances whatever
one chunk's fate and a run's state follows its chunks in the transaction that changed
them. Each layer names a step its own way: an operation for what the operator asked
(``operations.discard``), an outcome for what became of the chunk
(``outcomes.discarded``), a transition for its edge (``transitions.dead_to_discarded``).
The transitions (cleanup.engine.transitions) know nothing of the window; the window
(cleanup.engine.window) knows nothing of how chunks end.
"""

from __future__ import annotations

from collections.abc import Iterable

import structlog
from django.db import transaction

from cleanup.conf import conf
from cleanup.engine import halts, sizing, transitions, window
from cleanup.exceptions import cause_of
from cleanup.models import Chunk, Run
from cleanup.policies import Policy, find_policy

log = structlog.get_logger("cleanup.ledger")


def committed(chunk: Chunk, *, deleted: int, retries: int, elapsed: float,
           updated: int = 0, locked: int = 0, cpu_wait: float | None = None,
           policy: Policy | None = None, delivery: int | None = None
           ) -> transitions.Committed:
    """``transitions.to_committed``, then the window topped up and the run settled
    (``policy``: the run's, where the caller knows it). True if the chunk moved."""
    # With the policy at hand, the window's top-up opens in the same round trip.
    done = transitions.to_committed(
        chunk, deleted=deleted, retries=retries, elapsed=elapsed, updated=updated,
        locked=locked, cpu_wait=cpu_wait, delivery=delivery,
        then_open=(policy.name, window.size(policy), sizing.LATEST, conf.LOCK_TIMEOUT_MS)
        if policy else None)
    if done:
        _top_up_and_settle(chunk.run_id, policy=policy, opened=done.opened)
    return done


def dead_lettered(chunk: Chunk, reason: str, failure_class: str, *, received: str = "",
                delivery: int | None = None) -> bool:
    """``transitions.to_dead_lettered`` in a savepoint with the top-up and the settling; False
    if the chunk had finished (a committed chunk is never dead-lettered). A run whose
    chunks mostly fail halts its policy first (cleanup.engine.halts), so the top-up
    plans nothing more of it."""
    with transaction.atomic():
        dead = transitions.to_dead_lettered(chunk, reason, failure_class, received=received,
                                            delivery=delivery)
        if dead:
            halts.weigh_failing(chunk.run_id)
            _top_up_and_settle(chunk.run_id)
    if dead:
        log.warning(
            "chunk dead-lettered",
            **transitions.chunk_fields(chunk),
            outcome="dead_lettered",
            failure_class=failure_class,
            reason=cause_of(reason),  # the error, not "Traceback (most recent call last):"
        )
    return dead


def discarded(pks: Iterable[int], reason: str) -> list[Chunk]:
    """``transitions.dead_to_discarded``; then each run's window and state, runs in lock
    order."""
    chunks = transitions.dead_to_discarded(pks, reason)
    for run_id in transitions.in_lock_order({c.run_id for c in chunks}):
        _top_up_and_settle(run_id)
    return chunks


def requeued(pks: Iterable[int]) -> list[Chunk]:
    """``transitions.dead_to_enqueued``; then each run settled (it reopens), runs in lock
    order. No top-up: the chunks requeued take room in the window, they give none."""
    chunks = transitions.dead_to_enqueued(pks)
    for run_id in transitions.in_lock_order({c.run_id for c in chunks}):
        transitions.settle_run(run_id)
    return chunks


def cancelled(run_ids: Iterable) -> list[tuple[Run, int]]:
    """``transitions.runs_to_cancelled``; the room the runs held goes to their policies' other
    runs once this commits (topping up locks runs under the planning lock, and this
    transaction already holds runs)."""
    cancelled = transitions.runs_to_cancelled(run_ids)
    for name in sorted({run.policy for run, _ in cancelled}):
        if (policy := find_policy(name)) is not None:
            transaction.on_commit(lambda policy=policy: window.top_up_now(policy))
    return cancelled


def _top_up_and_settle(run_id, *, policy: Policy | None = None,
                       opened: dict | None = None) -> None:
    """Top the run's policy's window up (whatever planning meets, the chunk's end
    commits), then bring the run's state in line with its chunks, unless the top-up
    wrote the run's planning: it settled the run there, or the run has more to plan and
    stays running under the row lock the top-up took (most chunks' end, one call fewer).

    ``policy`` is the run's policy where the caller has it (a chunk's worker does),
    which saves reading it on every chunk's end, with the top-up it opened (``opened``);
    a policy a deploy removed plans nothing."""
    if policy is None:
        name = Run.objects.filter(pk=run_id).values_list("policy", flat=True).first()
        policy = find_policy(name) if name is not None else None
    topped = (window.top_up_safely(policy, opened) if policy is not None
              else window.TopUp())
    if run_id not in topped.settled:
        transitions.settle_run(run_id)
