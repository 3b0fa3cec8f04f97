"""Apply a run in its dispatching process (``--sync``), under the run's lease, and hand
it to the queue when this process cannot finish it.

The lease (cleanup.engine.sync_lease) is what tells the workers this process still
applies the run: while it is live they leave the run alone; once it lapses they take
the run over, and this process, renewing it in each chunk's transaction, stops. The
process itself hands the run over when it stops short of the end: a chunk whose
transient error outlasted the in-task retries (the chunk is left to the queue's
own retries, like any other delivery), the policy's window held by its other runs, an
interrupt. So a ``--sync`` run is never left for nobody to finish.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from django.db.models import Q, Sum

from cleanup.conf import conf
from cleanup.engine import halts, sync_lease, transitions, window
from cleanup.engine.worker import apply_chunk, transient
from cleanup.exceptions import LeaseLost, cause_of
from cleanup.models import ROWS_CHANGED, Chunk, Run

log = structlog.get_logger("cleanup.in_process")

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


def apply_in_process(run: Run, progress: Progress | None = None) -> Applied:
    """Apply the run's unfinished chunks here, one after another, until none is left
    (each commit plans the next), and return what was applied.

    The caller holds the run's lease. ``progress(chunks, rows, eligible)`` is called
    after each chunk, with the rows eligible at dispatch (None if not counted).
    """
    applied = own = 0
    rows = rows_changed_by(run)
    try:
        while chunk := (run.chunks.filter(state__in=Chunk.UNFINISHED).order_by("chunk_id")
                        .only("pk", "chunk_id", "message").first()):
            if not _still_ours(run):
                return _taken_over(run, applied, own)
            try:
                apply_chunk(chunk.message, leased=True)
            except LeaseLost:
                return _taken_over(run, applied, own)
            except Exception as exc:
                if not transient(exc):
                    raise
                # apply_chunk left the chunk retrying: from here its retries are the
                # queue's, as for any delivery that outlasts the in-task ones.
                cause = cause_of("".join(traceback.format_exception_only(exc)))
                note = (f"chunk #{chunk.chunk_id} met \"{cause}\" past "
                        f"{conf.TRANSIENT_RETRIES} in-task retries: the run is handed to "
                        "the queue, which retries it")
                window.hand_over(run.pk, reason=note)
                return Applied(applied, own, rows_changed_by(run), True, note, chunk.chunk_id,
                               cause)
            transitions.to_acknowledged(Q(pk=chunk.pk))
            applied += 1
            changed = _rows_of(chunk)
            own += changed
            rows += changed
            if progress is not None:
                progress(applied, rows, run.eligible_at_dispatch)
    except BaseException as exc:
        # Interrupted (Ctrl-C) or a bug: the queue finishes the run, now rather than
        # once the workers see the lease gone.
        _give_up(run, f"this process stopped: {type(exc).__name__}")
        raise
    run.refresh_from_db()
    if run.state == Run.State.RUNNING and not run.planned_all:
        behind = waiting_behind(run)
        if halts.open_halts(run.policy):
            note = ("the policy is halted (cleanup_status shows why): the rest of the run is "
                    "handed to the queue, which goes on once it is resumed")
        else:
            note = ("the policy's window is held by "
                    + (f"run {behind}" if behind else "its other runs")
                    + ": the rest of the run is handed to the queue")
        window.hand_over(run.pk, reason=note)
        return Applied(applied, own, rows_changed_by(run), True, note)
    locked = Chunk.objects.filter(run=run).aggregate(n=Sum("rows_locked"))["n"] or 0
    return Applied(applied, own, rows_changed_by(run), rows_locked=locked)


def rows_changed_by(run: Run) -> int:
    """Rows the run's chunks have changed (deleted or updated) so far."""
    return Chunk.objects.filter(run=run).aggregate(n=Sum(ROWS_CHANGED))["n"] or 0


def waiting_behind(run: Run):
    """The oldest other running run of the policy with chunks in flight: the one a run
    that got no room in the window waits behind."""
    return (Run.objects.filter(policy=run.policy, state=Run.State.RUNNING,
                               chunks__state__in=Chunk.UNFINISHED)
            .exclude(pk=run.pk).order_by("created_at", "pk")
            .values_list("pk", flat=True).first())


def _rows_of(chunk: Chunk) -> int:
    return Chunk.objects.filter(pk=chunk.pk).values_list(ROWS_CHANGED, flat=True).get()


def _still_ours(run: Run) -> bool:
    """Whether this process still applies the run: its lease is its own (renewed) and
    the workers have not taken the run over."""
    return sync_lease.renew(run.pk) and Run.objects.filter(pk=run.pk, in_process=True).exists()


def _taken_over(run: Run, applied: int, own: int) -> Applied:
    # In process again: a later --sync of its key took it (from the queue, or at once).
    by = ("another process applying it (--sync)"
          if Run.objects.filter(pk=run.pk, in_process=True).exists() else "the workers")
    return Applied(applied, own, rows_changed_by(run), True,
                   f"taken over by {by}: this process's lease on the run lapsed (not "
                   f"renewed within {conf.SYNC_LEASE_SECONDS} s: frozen, or cut off from "
                   "the database)")


def _give_up(run: Run, reason: str) -> None:
    try:
        window.hand_over(run.pk, reason=reason)
    except Exception as exc:  # noqa: BLE001 - the workers take it over once we are gone
        log.error("handing the run to the queue failed; the workers take it over once "
                  "this process has gone", run_id=str(run.pk), error=str(exc))
