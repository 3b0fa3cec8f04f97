"""What a dispatch did: the result it returns, that result as JSON (``cleanup_dispatch
--json``, the log line) and in one sentence (the command, the console after a dispatch
from the admin)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from cleanup.display import number, utc_text
from cleanup.engine.halts import describe
from cleanup.models import Halt, Run

if TYPE_CHECKING:
    from cleanup.engine.dispatch import Request
    from cleanup.engine.in_process import Applied
    from cleanup.engine.preview import Preview


@dataclass(frozen=True)
class DispatchResult:
    """What a dispatch did: the run it created, joined or found by its key, or what a
    dry run would plan (``preview``). The run's figures are read from the run."""

    request: Request
    run: Run | None = None  # None: a dry run
    preview: Preview | None = None  # a dry run's counts per partition
    created: bool = False
    coalesced: bool = False  # the run in flight that took this request
    # The first window as this dispatch planned it (a run it created).
    first_chunks: int = 0
    first_rows: int = 0
    # A run that got no room in the policy's window: the run it waits behind.
    waiting_behind: uuid.UUID | None = None
    # --sync: what this process applied, and whether it handed the rest to the queue.
    applied: Applied | None = None
    # The policy's halts open when the dispatch (or its --sync process) ended.
    halts: tuple[Halt, ...] = ()

    @property
    def halted(self) -> str:
        """Why the policy plans nothing now, in words; empty when it is not halted."""
        return "; ".join(describe(halt) for halt in self.halts)

    @property
    def dry_run(self) -> bool:
        return self.run is None

    @property
    def policy(self) -> str:
        return self.request.policy.name

    @property
    def mutation(self) -> str:
        return self.request.policy.mutation

    @property
    def scheme(self) -> str:
        return self.run.scheme if self.run else self.request.scheme

    @property
    def cutoff(self) -> datetime:
        return self.run.cutoff if self.run else self.request.cutoff

    @property
    def candidates(self) -> int:
        """Rows planned so far (a dry run's: the rows it would plan)."""
        return self.run.candidates if self.run else self.preview.rows

    @property
    def chunks(self) -> int:
        return self.run.chunks_planned if self.run else self.preview.chunks

    @property
    def planned_all(self) -> bool:
        """False while the run still plans its chunks as it goes: ``candidates`` and
        ``chunks`` count only what is planned so far."""
        return self.run.planned_all if self.run else True

    @property
    def eligible(self) -> int | None:
        """Rows eligible at the cutoff when the run was dispatched, counted once; None
        when that count failed, or for a run dispatched before they were counted."""
        return self.run.eligible_at_dispatch if self.run else self.preview.rows

    def fields(self) -> dict:
        """The result, JSON-safe: what ``cleanup_dispatch --json`` prints."""
        run, applied = self.run, self.applied
        return {
            "run_id": str(run.id) if run else None,
            "created": self.created,
            "dry_run": self.dry_run,
            "policy": self.policy,
            "scheme": self.scheme,
            "cutoff": self.cutoff.isoformat(timespec="microseconds"),
            "candidates": self.candidates,
            "eligible": self.eligible,
            "first_chunks": self.first_chunks,
            "first_rows": self.first_rows,
            "waiting_behind": str(self.waiting_behind) if self.waiting_behind else None,
            "halted": self.halted or None,
            "planned_all": self.planned_all,
            "state": run.state if run else None,
            # --sync: what this process applied, and whether the queue has the rest.
            "sync": None if applied is None else {
                "chunks_applied": applied.chunks,
                "rows_changed": applied.rows,
                "run_rows_changed": applied.run_rows,
                "rows_locked": applied.rows_locked,
                "handed_to_queue": applied.handed_over,
                "failed_chunk": applied.failed_chunk,
                "cause": applied.cause or None,
                "note": applied.note or None,
            },
            "summary": describe_dispatch(self),
        }


def describe_dispatch(result: DispatchResult) -> str:
    """Say in one sentence what a dispatch did and what it knows, as the command prints
    it and the console shows it: "Dispatched run ... of expire-holds (items, cutoff
    ...): 200,000 rows eligible; first 4 chunks planned (1,664 rows), the rest as they
    finish."
    """
    cutoff = f"{utc_text(result.cutoff)} UTC"
    if result.dry_run:
        sizing = f", {result.preview.sizing}" if result.preview and result.preview.sizing else ""
        return (f"Dry run: {result.policy} would plan {_count(result.chunks, 'chunk')} "
                f"({result.scheme}) for {_count(result.candidates, 'row')} eligible at "
                f"{cutoff}{sizing}.")
    run = result.run
    what = f"run {run.id} of {result.policy} ({result.scheme}, cutoff {cutoff})"
    if result.coalesced:
        head = f"Joined {what}, in flight since {utc_text(run.created_at)} UTC"
        when = " at its dispatch"
    elif result.created:
        head, when = f"Dispatched {what}", ""
    else:
        head, when = f"Already dispatched: {what}", " at dispatch"
    parts = []
    if result.eligible is not None:
        parts.append(f"{_count(result.eligible, 'row')} eligible{when}")
    parts.append(_planned(result))
    if result.applied is not None:
        parts.append(_applied(result, result.applied))
    if result.halts and run.state != Run.State.RUNNING:
        parts.append(f"the policy is now {result.halted}{_until(result)}")
    return f"{head}: {'; '.join(parts)}."


def _until(result: DispatchResult) -> str:
    """Until when a halted policy plans nothing: an operator's pause and a failing halt
    end only by a resume, the database's pressure by itself."""
    if any(halt.reason in Halt.ENDED_BY_OPERATOR for halt in result.halts):
        return (f"; nothing more is planned until it is resumed (cleanup_resume --policy "
                f"{result.policy})")
    return "; nothing more is planned until that clears (a worker looks again by itself)"


def _planned(result: DispatchResult) -> str:
    if result.halts and result.run.state == Run.State.RUNNING:
        return f"the policy is {result.halted}{_until(result)}"
    if result.waiting_behind is not None:
        return f"waiting for room in the window behind run {result.waiting_behind}"
    if result.chunks == 0:
        return "nothing to do" if result.planned_all else "waiting for room in the window"
    if result.created:
        chunks, rows = result.first_chunks, result.first_rows
    else:
        chunks, rows = result.chunks, result.candidates
    planned = f"{_count(chunks, 'chunk')} planned ({_count(rows, 'row')})"
    if result.planned_all and (not result.created or result.first_chunks == result.chunks):
        return planned
    if result.created:
        return f"first {planned}, the rest as they finish"
    return f"{planned} so far, the rest as they finish"


def _applied(result: DispatchResult, applied: Applied) -> str:
    if applied.chunks == 0 and applied.note and not applied.handed_over:
        return applied.note  # another process applies it
    verb = "updated" if result.mutation == "update" else "deleted"
    of_eligible = ("" if result.eligible is None
                   else f" of {_count(result.eligible, 'row')}")
    if applied.rows == applied.run_rows:
        rows = (f"{number(applied.rows)}{of_eligible}" if of_eligible
                else _count(applied.rows, "row"))
        text = f"applied here: {rows} {verb} in {_count(applied.chunks, 'chunk')}"
    else:  # other processes applied some of the run too
        text = (f"applied here: {_count(applied.rows, 'row')} {verb} in "
                f"{_count(applied.chunks, 'chunk')} (the run's chunks: "
                f"{number(applied.run_rows)}{of_eligible or ' rows'} {verb} in all)")
    if applied.rows_locked:
        text += (f", {number(applied.rows_locked)} skipped: locked by another transaction "
                 "(a later run takes them)")
    return f"{text}; {applied.note}" if applied.note else text


def _count(n: int, word: str) -> str:
    return f"{number(n)} {word}" + ("" if n == 1 else "s")
