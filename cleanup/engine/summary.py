"""The sentence that says what a dispatch did and what it knows: the command prints it,
the console shows it after a dispatch from the admin, the log line carries it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cleanup.display import number, utc_text

if TYPE_CHECKING:
    from cleanup.engine.dispatch import DispatchResult
    from cleanup.engine.in_process import Applied


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
    return f"{head}: {'; '.join(parts)}."


def _planned(result: DispatchResult) -> str:
    if result.halted:
        if any(part.startswith("paused") for part in result.halted.split("; ")):
            return (f"the policy is {result.halted}; nothing more is planned until it is "
                    f"resumed (cleanup_resume --policy {result.policy})")
        # A pressure halt ends by itself: resuming is for an operator's pause.
        return (f"the policy is {result.halted}; nothing more is planned until that clears "
                "(a worker looks again by itself)")
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
    rows = (f"{number(applied.rows)} of {_count(result.eligible, 'row')}"
            if result.eligible is not None else _count(applied.rows, "row"))
    text = f"applied here: {rows} {verb} in {_count(applied.chunks, 'chunk')}"
    if applied.rows_locked:
        text += (f", {number(applied.rows_locked)} skipped: locked by another transaction "
                 "(a later run takes them)")
    return f"{text}; {applied.note}" if applied.note else text


def _count(n: int, word: str) -> str:
    return f"{number(n)} {word}" + ("" if n == 1 else "s")
