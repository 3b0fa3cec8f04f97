"""Apply a run in the process that dispatched it (``--sync``), as one more worker of
that run.

The run is dispatched like any other and its messages go to the queue; this process
takes them as a worker would (cleanup.engine.transport.applying_here) and applies their
chunks one after another, each commit planning the next. It holds nothing the workers
wait for: if it dies or freezes, each message it took goes to the workers once its
claim lapses (``CLEANUP_SYNC_CLAIM_SECONDS`` after it was sent). When it stops before
the run's end (a chunk's transient error past the in-task retries, the policy's window
held by its other runs, a halt, an interrupt) it gives its messages back at once and
the queue goes on.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass

from django.db.models import Sum

from cleanup.conf import conf
from cleanup.engine import halts, leases, transitions, transport, window
from cleanup.engine.worker import apply_chunk, transient
from cleanup.exceptions import cause_of
from cleanup.models import ROWS_CHANGED, Chunk, Run

Progress = Callable[[int, int, "int | None"], None]


@dataclass(frozen=True)
class Applied:
    """What a ``--sync`` dispatch applied in its own process."""

    chunks: int  # chunks this process applied
    rows: int  # rows those chunks changed
    run_rows: int  # rows the run's chunks have changed in all, here and elsewhere
    handed_over: bool = False  # the rest of the run is the queue's
    # Why it stopped before the run's end, in words; empty when it got there.
    note: str = ""
    failed_chunk: int | None = None  # the chunk whose error made it stop
    cause: str = ""  # that error's own line
    # Eligible rows its chunks skipped, kept locked by another transaction: a later
    # run takes them.
    rows_locked: int = 0


def apply_in_process(run: Run, taken: dict, progress: Progress | None = None) -> Applied:
    """Apply the run's unfinished chunks here, one after another, until none is left
    (each commit plans the next), and return what was applied.

    ``taken``: the queue rows this process holds for the run's chunks
    (``transport.applying_here``). ``progress(chunks, rows, eligible)`` is called after
    each chunk, with the rows eligible at dispatch (None if not counted).
    """
    applied = own = 0
    rows = rows_changed_by(run)
    while chunk := (run.chunks.filter(state__in=Chunk.UNFINISHED).order_by("chunk_id")
                    .only("pk", "chunk_id", "message").first()):
        try:
            apply_chunk(chunk.message, here=True)
        except Exception as exc:
            if not transient(exc):
                raise
            # apply_chunk left the chunk retrying: from here its retries are the
            # queue's, as for any delivery that outlasts the in-task retries.
            cause = cause_of("".join(traceback.format_exception_only(exc)))
            note = (f"chunk #{chunk.chunk_id} met \"{cause}\" past "
                    f"{conf.TRANSIENT_RETRIES} in-task retries: the rest of the run is the "
                    "queue's, which retries it")
            return Applied(applied, own, rows_changed_by(run), True, note, chunk.chunk_id,
                           cause)
        transport.finished_here(taken, chunk.pk)
        transitions.to_acknowledged(chunk.run_id, chunk.chunk_id)
        changed = _committed_here(chunk)
        if changed is None:
            continue  # a worker had finished it: this delivery was a no-op
        applied += 1
        own += changed
        rows += changed
        if progress is not None:
            progress(applied, rows, run.eligible_at_dispatch)
    run.refresh_from_db()
    if run.state == Run.State.RUNNING and not run.planned_all:
        behind = window.waiting_behind(run)
        if halts.open_halts(run.policy):
            note = ("the policy is halted (cleanup_status shows why): the rest of the run is "
                    "the queue's, which goes on once it is resumed")
        else:
            note = ("the policy's window is held by "
                    + (f"run {behind}" if behind else "its other runs")
                    + ": the rest of the run is the queue's")
        return Applied(applied, own, rows_changed_by(run), True, note)
    locked = Chunk.objects.filter(run=run).aggregate(n=Sum("rows_locked"))["n"] or 0
    return Applied(applied, own, rows_changed_by(run), rows_locked=locked)


def rows_changed_by(run: Run) -> int:
    """Rows the run's chunks have changed (deleted or updated) so far."""
    return Chunk.objects.filter(run=run).aggregate(n=Sum(ROWS_CHANGED))["n"] or 0


def _committed_here(chunk: Chunk) -> int | None:
    """The rows this process's delivery of the chunk changed, if that delivery is the
    one that committed it; None if it found the chunk finished (a worker's delivery
    committed it first). Read from the chunk's history, where each delivery names its
    worker; a history edited out of shape reads as not applied here."""
    history = Chunk.objects.filter(pk=chunk.pk).values_list("history", flat=True).get()
    ours = [entry for entry in (history if isinstance(history, list) else [])
            if isinstance(entry, dict) and entry.get("worker") == leases.this_process()]
    last = max(ours, key=lambda entry: entry.get("n") if isinstance(entry.get("n"), int)
               else -1, default=None)
    if last is None or last.get("outcome") != "committed":
        return None
    rows = last.get("rows", 0)
    return rows if isinstance(rows, int) else 0
