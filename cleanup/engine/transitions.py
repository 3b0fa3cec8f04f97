"""The chunk and run state machine: every write of a chunk's or a run's state and
counters, and its guard.

Nothing else writes the ledger's runs and chunks: their creation, their states, their
delivery and send counters, a run's planning frontier. Each transition is one function
whose UPDATE names the states it may leave, so a stale caller, a second click or a late
delivery changes nothing: a committed chunk is never dead-lettered, a cancelled run
stays cancelled, and counters only ever add. This module imports only the models: what
happens around a transition (the window topped up, the run settled) is
cleanup.engine.outcomes's, one level up.

    planned ──enqueue──▶ enqueued ──commit──▶ committed ──acknowledge──▶ acknowledged
       │                  │   ▲                   ▲
       │                retry │ (redelivery)      │ commit
       │                  ▼   │                   │
       └──────────────▶ retrying ─────────────────┘
    planned, enqueued, retrying ──dead_letter──▶ dead_lettered ──requeue──▶ enqueued
                                                        └──discard──▶ discarded
    planned, enqueued, retrying ──cancel (or cancel_late)──▶ cancelled

A run is running while it is still planning (cleanup.engine.window) or any chunk is
unfinished, then completed or completed with dead letters (``settle_run``);
``cancel_runs`` ends it for good.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import structlog
from django.db.models import F, Q
from django.utils import timezone

from cleanup.exceptions import cause_of
from cleanup.expressions import Appended, MergedWhere
from cleanup.models import Chunk, Run

log = structlog.get_logger("cleanup.ledger")

UNFINISHED = Chunk.UNFINISHED
# A chunk keeps the history of its last deliveries only: one requeued again and again
# (or a message duplicated a thousand times) must not grow its row without end.
HISTORY_KEPT = 50


def planned_to_enqueued(pks: Iterable[int], now: datetime | None = None) -> int:
    """planned → enqueued, as their messages are sent."""
    return Chunk.objects.filter(pk__in=list(pks), state=Chunk.State.PLANNED).update(
        state=Chunk.State.ENQUEUED, enqueued_at=now or timezone.now()
    )


def to_committed(chunk: Chunk, *, deleted: int, retries: int, elapsed: float,
           updated: int = 0, locked: int = 0, cpu_wait: float | None = None,
           delivery: int | None = None) -> bool:
    """unfinished → committed, with the outcome, in the transaction of the chunk's DELETE.

    ``elapsed`` covers the transaction up to this write (the commit itself is not in
    it); ``cpu_wait`` is how much of it the worker spent waiting for a CPU; ``locked``
    the eligible rows it skipped because another transaction kept them locked;
    ``delivery`` the number of the delivery that committed it, ended in its history.
    """
    updated = Chunk.objects.filter(pk=chunk.pk, state__in=UNFINISHED).update(
        duration_ms=round(elapsed * 1000),
        cpu_wait_ms=None if cpu_wait is None else round(min(cpu_wait, elapsed) * 1000),
        state=Chunk.State.COMMITTED,
        committed_at=timezone.now(),
        rows_deleted=F("rows_deleted") + deleted,
        rows_updated=F("rows_updated") + updated,
        items_skipped=F("items_skipped") + max(chunk.planned_rows - deleted - updated - locked,
                                               0),
        rows_locked=F("rows_locked") + locked,
        deliveries_completed=F("deliveries_completed") + 1,
        noop_deliveries=F("noop_deliveries") + (0 if deleted or updated else 1),
        transient_retries=F("transient_retries") + retries,
        **_ended(delivery, "committed", rows=deleted + updated, locked=locked,
                 retries=retries),
    )
    return bool(updated)


def count_noop(chunk: Chunk, *, retries: int, already: str,
               delivery: int | None = None) -> None:
    """A delivery of a chunk that had finished (``already``, its state): completed, and
    it changed nothing."""
    Chunk.objects.filter(pk=chunk.pk).update(
        deliveries_completed=F("deliveries_completed") + 1,
        noop_deliveries=F("noop_deliveries") + 1,
        transient_retries=F("transient_retries") + retries,
        **_ended(delivery, f"no-op: already {already}", retries=retries),
    )


def start_delivery(chunk: Chunk, *, received_at: datetime | None, worker: str = "",
                   outcome: str = "") -> int:
    """A delivery started (committed before its work, so a killed worker leaves its
    trace) and entered in the chunk's history; ``received_at`` None for a message too
    malformed to be delivered, ``outcome`` for a delivery that ends as it starts.
    Returns the delivery's number: the caller holds the chunk's lock, so it is exact.
    """
    number = chunk.deliveries + 1
    at = (received_at or timezone.now()).isoformat()
    entry = {"n": number, "at": at, "worker": worker}
    if outcome:
        entry.update(ended_at=at, outcome=outcome)
    stamp = {"last_delivery_at": received_at} if received_at is not None else {}
    Chunk.objects.filter(pk=chunk.pk).update(
        deliveries=F("deliveries") + 1,
        history=Appended("history", entry, keep=HISTORY_KEPT),
        **stamp,
    )
    return number


def _ended(delivery: int | None, outcome: str, *, error: str = "", rows: int = 0,
           locked: int = 0, retries: int = 0) -> dict:
    """The update that ends delivery number ``delivery`` in the chunk's history (none
    for a write that ends no delivery); an error is kept as its one line."""
    if delivery is None:
        return {}
    patch = {"ended_at": timezone.now().isoformat(), "outcome": outcome}
    patch.update({name: value for name, value in
                  (("rows", rows), ("locked", locked), ("retries", retries),
                   ("error", cause_of(error))) if value})
    return {"history": MergedWhere("history", "n", delivery, patch)}


def to_acknowledged(chunks: Q) -> int:
    """committed → acknowledged, once the broker has acknowledged the message."""
    return Chunk.objects.filter(chunks, state=Chunk.State.COMMITTED).update(
        state=Chunk.State.ACKNOWLEDGED, acknowledged_at=timezone.now()
    )


def to_retrying(chunk: Chunk, *, error: str, retries: int, delivery: int | None = None) -> bool:
    """unfinished → retrying: the delivery failed transiently and is left for redelivery."""
    return bool(Chunk.objects.filter(pk=chunk.pk, state__in=UNFINISHED).update(
        **_ended(delivery, "left for redelivery", error=error, retries=retries),
        state=Chunk.State.RETRYING,
        failure_class=Chunk.FailureClass.TRANSIENT,
        failures=F("failures") + 1,
        transient_retries=F("transient_retries") + retries,
        last_error=error,
        cause=cause_of(error),
    ))


def to_dead_lettered(chunk: Chunk, reason: str, failure_class: str, *,
                received: str = "", delivery: int | None = None) -> bool:
    """unfinished → dead_lettered with the class of its failure (and the message the
    delivery carried, where it differs from the one sent); False if it had finished
    (a committed chunk is never dead-lettered).

    A verdict of deliveries that kept dying (poison, or a transient error that never
    cleared) is not an error of its own: the last real error the deliveries met (a
    lock timeout) stays the chunk's cause beside it. (A transient error is otherwise
    retried, never dead-lettered.)
    """
    if failure_class in (Chunk.FailureClass.POISON, Chunk.FailureClass.TRANSIENT):
        error = {"verdict": reason}
    else:
        error = {"verdict": "", "last_error": reason, "cause": cause_of(reason)}
    return bool(Chunk.objects.filter(pk=chunk.pk, state__in=UNFINISHED).update(
        state=Chunk.State.DEAD_LETTERED,
        dead_lettered_at=timezone.now(),
        failure_class=failure_class,
        **error,
        dead_letters=F("dead_letters") + 1,
        **({"received_message": received} if received else {}),
        **_ended(delivery, f"dead-lettered ({failure_class})", error=reason),
    ))


def dead_to_enqueued(pks: Iterable[int]) -> list[Chunk]:
    """dead_lettered → enqueued, unless the run was cancelled (the caller settles the
    runs, which reopen).

    The deliveries that never completed are set aside, so the poison limit counts
    afresh; the counters themselves keep adding. Returns the chunks requeued, locked.
    """
    dead = list(_lock_chunks(Chunk.objects.filter(pk__in=list(pks),
                                                  state=Chunk.State.DEAD_LETTERED)))
    # Then their runs, and only now is "not cancelled" settled: a cancel that committed
    # while the chunks were being locked is seen here.
    cancelled = set(_lock_runs(Run.objects.filter(
        pk__in={c.run_id for c in dead}, state=Run.State.CANCELLED)).values_list("pk", flat=True))
    chunks = [c for c in dead if c.run_id not in cancelled]
    now = timezone.now()
    for chunk in chunks:
        chunk.unfinished_forgiven = chunk.deliveries - chunk.deliveries_completed
        chunk.state = Chunk.State.ENQUEUED
        chunk.enqueued_at = now
        chunk.save(update_fields=["unfinished_forgiven", "state", "enqueued_at"])
    return chunks


def dead_to_discarded(pks: Iterable[int], reason: str) -> list[Chunk]:
    """dead_lettered → discarded with a reason; returns the chunks discarded, locked."""
    chunks = list(_lock_chunks(Chunk.objects.filter(pk__in=list(pks),
                                                    state=Chunk.State.DEAD_LETTERED)))
    Chunk.objects.filter(pk__in=[c.pk for c in chunks]).update(
        state=Chunk.State.DISCARDED, discard_reason=reason, discarded_at=timezone.now()
    )
    return chunks


def runs_to_cancelled(run_ids: Iterable) -> list[tuple[Run, int]]:
    """running → cancelled, and each run's unfinished chunks → cancelled.

    Chunks are locked before runs: the order a committing worker takes its locks in.
    Returns each cancelled run with the number of its chunks cancelled.
    """
    run_ids = list(run_ids)
    unfinished = list(
        _lock_chunks(Chunk.objects.filter(run_id__in=run_ids, state__in=UNFINISHED))
        .values_list("pk", flat=True)
    )
    runs = list(_lock_runs(Run.objects.filter(pk__in=run_ids, state=Run.State.RUNNING)))
    now = timezone.now()
    cancelled = []
    for run in runs:
        chunks = Chunk.objects.filter(run=run, pk__in=unfinished, state__in=UNFINISHED).update(
            state=Chunk.State.CANCELLED
        )
        # A chunk requeued between the first lock and the run's: cancel it too, unless a
        # delivery holds it now (its commit then finds the run cancelled and keeps it so).
        late = _lock_chunks(Chunk.objects.filter(run=run, state__in=UNFINISHED),
                            skip_locked=True).values_list("pk", flat=True)
        chunks += Chunk.objects.filter(pk__in=list(late)).update(state=Chunk.State.CANCELLED)
        # Its frontier stops: nothing more is planned for it.
        run.state, run.finished_at = Run.State.CANCELLED, now
        run.planned_all, run.frontier = True, None
        run.save(update_fields=["state", "finished_at", "planned_all", "frontier"])
        cancelled.append((run, chunks))
    return cancelled


def _lock_chunks(chunks, *, skip_locked: bool = False):
    """Lock chunk rows only (not their runs, which the default ordering would join), in pk
    order: chunks before runs, the order a committing worker takes its locks in."""
    return chunks.select_for_update(of=("self",), skip_locked=skip_locked).order_by("pk")


def chunk_fields(chunk: Chunk) -> dict:
    """What every log line about a chunk names it by."""
    return {"run_id": str(chunk.run_id), "chunk_id": chunk.chunk_id, "policy": chunk.run.policy}


def _lock_runs(runs):
    """Lock run rows oldest first, the order the window plans them in."""
    return runs.select_for_update().order_by("created_at", "pk")


def in_lock_order(run_ids) -> list:
    return list(Run.objects.filter(pk__in=list(run_ids)).order_by("created_at", "pk")
                .values_list("pk", flat=True))


def late_to_cancelled(chunk: Chunk) -> bool:
    """unfinished → cancelled, for a delivery that finds its run cancelled after the
    cancel passed its chunk by (a delivery held it then)."""
    return bool(Chunk.objects.filter(pk=chunk.pk, state__in=UNFINISHED).update(
        state=Chunk.State.CANCELLED))


def record_eligible(run_id, rows: int) -> bool:
    """The rows eligible at dispatch, recorded once (a fact of the dispatch, like its
    cutoff); False if it had been recorded already."""
    return bool(Run.objects.filter(pk=run_id, eligible_at_dispatch__isnull=True)
                .update(eligible_at_dispatch=rows))


def settle_run(run_id) -> Run:
    """Bring a run's state in line with its chunks; a cancelled run stays cancelled.

    Running while it is still planning or any chunk is unfinished; then completed, or
    completed with dead letters. Locking the run row serialises the last chunks of a run: a chunk
    committing at the same moment waits here, then its count sees this one's commit.
    """
    run = Run.objects.select_for_update().get(pk=run_id)
    if run.state == Run.State.CANCELLED:
        return run
    chunks = Chunk.objects.filter(run_id=run_id)
    if not run.planned_all or chunks.filter(state__in=UNFINISHED).exists():
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


def create_run(**fields) -> Run:
    """A new run, as dispatch froze it (its cutoff, parameters, span and frontier)."""
    return Run.objects.create(**fields)


def plan_chunk(run: Run, chunk_id: int, message: dict, rows: int, *, send_now: bool,
               now: datetime) -> Chunk:
    """A chunk of the run's, planned: enqueued already when its message is sent in this
    transaction (django-q2's ORM broker), else planned until it is sent."""
    return Chunk.objects.create(
        run=run, chunk_id=chunk_id,
        state=Chunk.State.ENQUEUED if send_now else Chunk.State.PLANNED,
        message=message, planned_rows=rows, planned_at=now,
        enqueued_at=now if send_now else None,
    )


def record_planning(run: Run) -> None:
    """Store how far the run's planning has got: its frontier, whether it planned all,
    its candidates and chunks so far, its next chunk's size, the messages it sent; any
    planning error is cleared. The caller holds the run's row lock, so a count another
    sender adds (count_sent) waits for this write and adds to it."""
    run.planning_error = ""
    run.save(update_fields=["frontier", "planned_all", "candidates", "chunks_planned",
                            "next_chunk_size", "max_span", "planning_error",
                            "messages_sent"])


def record_planning_error(run_id, error: str) -> None:
    """Keep why planning the run's next chunk failed (it is tried again later)."""
    Run.objects.filter(pk=run_id).update(planning_error=error)


def count_sent(per_run: dict) -> None:
    """Messages sent, per run (first sends and re-sends). Counted on the run, not its
    chunks: a chunk row may be locked by a delivery in progress, and a re-send must
    not wait for it."""
    for run_id, sent in per_run.items():
        Run.objects.filter(pk=run_id).update(messages_sent=F("messages_sent") + sent)


def count_reconciled(pks: Iterable[int], now: datetime) -> None:
    """Chunks the reconciler re-sent."""
    Chunk.objects.filter(pk__in=list(pks)).update(reconciled_at=now,
                                                  reconciles=F("reconciles") + 1)
