"""Read a run's progress from the ledger."""

from __future__ import annotations

import re
import uuid

from django.core.exceptions import ValidationError
from django.db.models import CharField, Count, Sum
from django.db.models.functions import Cast

from cleanup import planning
from cleanup.exceptions import CleanupError, UnknownPolicy, UnknownRun
from cleanup.models import Chunk, Run
from cleanup.policies import get_policy

PREFIX = re.compile(r"[0-9a-f-]+")
# The shortest prefix of a run id taken: the admin shows eight characters.
MIN_PREFIX = 4


def get_run(run_id) -> Run:
    """The run with this id, or with this unique prefix of its id (as the admin shows it)."""
    text = str(run_id).strip().lower()
    if not text:
        raise CleanupError("run id is empty")
    try:
        return Run.objects.get(pk=uuid.UUID(text))
    except (ValueError, ValidationError, Run.DoesNotExist):
        pass
    if len(text) < MIN_PREFIX or not PREFIX.fullmatch(text):
        raise UnknownRun(run_id)
    matches = list(Run.objects.annotate(text_id=Cast("id", CharField()))
                   .filter(text_id__startswith=text).order_by("-created_at")[:6])
    if not matches:
        raise UnknownRun(run_id)
    if len(matches) > 1:
        shown = ", ".join(str(run.id) for run in matches[:5])
        raise CleanupError(f"run id prefix {text!r} is ambiguous: it matches {shown}"
                           f"{' and more' if len(matches) > 5 else ''}; give more of the id")
    return matches[0]


def latest_run() -> Run:
    run = Run.objects.order_by("-created_at").first()
    if run is None:
        raise UnknownRun("(latest): no run yet")
    return run


def mutation(run: Run, rows_updated: int = 0) -> str:
    """``delete`` or ``update``: what the run's chunks do to the rows they change (for a
    policy no longer registered, what they did)."""
    try:
        return get_policy(run.policy).mutation
    except UnknownPolicy:
        return "update" if rows_updated else "delete"


def run_summary(run: Run) -> dict:
    """Return the run's fields and its chunks' totals, JSON-safe.

    ``rows_changed`` is what the run's mutation changed: rows deleted, or updated.
    """
    chunks = Chunk.objects.filter(run=run)
    by_state = dict.fromkeys(Chunk.State.values, 0)
    by_state.update(chunks.values_list("state").annotate(n=Count("pk")).order_by())
    totals = chunks.aggregate(
        rows_deleted=Sum("rows_deleted"),
        rows_updated=Sum("rows_updated"),
        items_skipped=Sum("items_skipped"),
        noops=Sum("noop_deliveries"),
        deliveries=Sum("deliveries"),
        failures=Sum("failures"),
    )
    totals = {name: value or 0 for name, value in totals.items()}
    return {
        "run_id": str(run.id),
        "policy": run.policy,
        "mutation": mutation(run, totals["rows_updated"]),
        "scheme": run.scheme,
        "state": run.state,
        "trigger": run.trigger,
        "dispatch_key": run.dispatch_key,
        "replay_of": str(run.replay_of_id) if run.replay_of_id else None,
        "cutoff": run.cutoff.isoformat(timespec="microseconds"),
        "parameters": run.parameters,
        "candidates": run.candidates,
        "chunks_planned": run.chunks_planned,
        "planned_all": run.planned_all,
        "position": None if (at := planning.position(run)) is None else round(at, 4),
        "estimated_remaining_rows": planning.remaining_rows(run),
        "frontier": run.frontier,
        "window": run.window,
        "chunk_size": run.chunk_size,
        "next_chunk_size": run.next_chunk_size,
        "chunks": {**by_state, "total": sum(by_state.values())},
        "rows_changed": totals["rows_deleted"] + totals["rows_updated"],
        **totals,
        "created_at": run.created_at.isoformat(),
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
    }
