"""The whole chunk state machine: every transition tried from every state.

Each transition moves only the states its guard names; from any other state it
changes nothing (a committed chunk is never dead-lettered, a cancelled one stays so).
"""

from __future__ import annotations

import pytest

from cleanup.engine import outcomes, transitions
from cleanup.engine.dispatch import dispatch
from cleanup.models import Chunk, Run

pytestmark = pytest.mark.django_db

S = Chunk.State
UNFINISHED = {S.PLANNED, S.ENQUEUED, S.RETRYING}
# transition -> {from state: to state}; every state not listed must stay as it is.
TABLE = {
    "enqueue": {S.PLANNED: S.ENQUEUED},
    "commit": dict.fromkeys(UNFINISHED, S.COMMITTED),
    "acknowledge": {S.COMMITTED: S.ACKNOWLEDGED},
    "retry": dict.fromkeys(UNFINISHED, S.RETRYING),
    "dead_letter": dict.fromkeys(UNFINISHED, S.DEAD_LETTERED),
    "requeue": {S.DEAD_LETTERED: S.ENQUEUED},
    "discard": {S.DEAD_LETTERED: S.DISCARDED},
    "cancel": dict.fromkeys(UNFINISHED, S.CANCELLED),
}
APPLY = {
    "enqueue": lambda chunk: transitions.planned_to_enqueued([chunk.pk]),
    "commit": lambda chunk: transitions.to_committed(chunk, deleted=1, retries=0, elapsed=0.01),
    "acknowledge": lambda chunk: transitions.to_acknowledged(chunk.run_id, chunk.chunk_id),
    "retry": lambda chunk: transitions.to_retrying(chunk, error="lock timeout", retries=3),
    "dead_letter": lambda chunk: transitions.to_dead_lettered(chunk, "bad", "malformed"),
    "requeue": lambda chunk: transitions.dead_to_enqueued([chunk.pk]),
    "discard": lambda chunk: transitions.dead_to_discarded([chunk.pk], "not needed"),
    "cancel": lambda chunk: transitions.runs_to_cancelled([chunk.run_id]),
}
COUNTERS = ("rows_deleted", "deliveries_completed", "failures", "dead_letters",
            "transient_retries", "noop_deliveries", "items_skipped")


@pytest.mark.parametrize("transition", sorted(TABLE))
@pytest.mark.parametrize("state", S.values)
def test_each_transition_moves_only_the_states_its_guard_allows(expired_leases, transition,
                                                                state):
    chunk = dispatch("expire-leases").run.chunks.get()
    Chunk.objects.filter(pk=chunk.pk).update(state=state)
    chunk.refresh_from_db()
    before = {name: getattr(chunk, name) for name in COUNTERS}

    APPLY[transition](chunk)

    chunk.refresh_from_db()
    assert chunk.state == TABLE[transition].get(state, state)
    assert all(getattr(chunk, name) >= value for name, value in before.items())  # only add


def test_a_run_settles_from_its_chunks_and_a_cancelled_run_stays_cancelled(expired_leases):
    run = dispatch("expire-leases").run
    chunk = run.chunks.get()
    outcomes.dead_lettered(chunk, "bad", "malformed")
    assert Run.objects.get(pk=run.pk).state == Run.State.COMPLETED_WITH_DEAD_LETTERS
    outcomes.requeued([chunk.pk])
    assert Run.objects.get(pk=run.pk).state == Run.State.RUNNING
    outcomes.cancelled([run.pk])
    chunk.refresh_from_db()
    outcomes.committed(chunk, deleted=0, retries=0, elapsed=0.0)  # a late delivery
    assert Run.objects.get(pk=run.pk).state == Run.State.CANCELLED
    assert transitions.settle_run(run.pk).state == Run.State.CANCELLED


def test_a_transition_changes_only_its_chunk_and_the_outcome_settles_the_run(expired_leases):
    """The state machine writes the chunk; the run's state follows from the outcome
    layer above it (cleanup.engine.outcomes), in the same transaction."""
    run = dispatch("expire-leases").run
    chunk = run.chunks.get()

    assert transitions.to_committed(chunk, deleted=5, retries=0, elapsed=0.01)
    assert Run.objects.get(pk=run.pk).state == Run.State.RUNNING
    transitions.settle_run(run.pk)
    assert Run.objects.get(pk=run.pk).state == Run.State.COMPLETED


def test_a_dead_letter_of_a_cancelled_run_is_not_requeued(expired_leases):
    run = dispatch("expire-leases").run
    chunk = run.chunks.get()
    transitions.to_dead_lettered(chunk, "bad", "malformed")
    Run.objects.filter(pk=run.pk).update(state=Run.State.CANCELLED)

    assert transitions.dead_to_enqueued([chunk.pk]) == []
    chunk.refresh_from_db()
    assert chunk.state == S.DEAD_LETTERED
