"""Read a run's progress from the ledger."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Count, Sum
from django.utils import timezone

from cleanup.engine import halts, planning
from cleanup.engine.window import size as window_size
from cleanup.exceptions import UnknownPolicy
from cleanup.models import Chunk, Run, rows_changed
from cleanup.observability.overview import gone_policies, overview
from cleanup.policies import get_policy


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
        rows_locked=Sum("rows_locked"),
        noop_deliveries=Sum("noop_deliveries"),
        deliveries=Sum("deliveries"),
        failures=Sum("failures"),
    )
    totals = {name: value or 0 for name, value in totals.items()}
    halted = halts.open_halts(run.policy) if run.state == Run.State.RUNNING else []
    return {
        "run_id": str(run.id),
        "policy": run.policy,
        # Why the run's policy plans nothing now, in words (a pause); empty otherwise.
        "halted": [halts.describe(halt) for halt in halted],
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
        "rows_changed": rows_changed(totals),
        **totals,
        "created_at": run.created_at.isoformat(),
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
    }


def chunk_rows(run: Run, *, state: str | None = None, limit: int | None = None) -> dict:
    """The run's chunks in order (those in ``state``; the first ``limit``), JSON-safe.

    ``cause`` is the last real error's own line and ``verdict`` why the engine
    dead-lettered the chunk where that is not the error; ``total`` counts them all.
    """
    chunks = Chunk.objects.filter(run=run).order_by("chunk_id")
    if state:
        chunks = chunks.filter(state=state)
    fields = ("chunk_id", "state", "rows_deleted", "rows_updated", "deliveries", "cause",
              "verdict", "failure_class")
    rows = [dict(zip(fields, values, strict=True)) for values in
            (chunks if limit is None else chunks[:limit]).values_list(*fields)]
    for row in rows:
        row["rows_changed"] = rows_changed(row)
    return {"run_id": str(run.id), "policy": run.policy, "state": state,
            "chunks": rows, "total": len(rows) if limit is None else chunks.count()}


def requeue_preview(pks) -> dict[str, list[int]]:
    """The chunks a requeue of these chunk pks would send again, by run id: the
    dead-lettered ones of runs not cancelled (what ``transitions.dead_to_enqueued`` takes)."""
    found: dict[str, list[int]] = {}
    rows = (Chunk.objects.filter(pk__in=list(pks), state=Chunk.State.DEAD_LETTERED)
            .exclude(run__state=Run.State.CANCELLED)
            .order_by("run__created_at", "run_id", "chunk_id")
            .values_list("run_id", "chunk_id"))
    for run_id, chunk_id in rows:
        found.setdefault(str(run_id), []).append(chunk_id)
    return found


def policy_rows(now: datetime | None = None) -> list[dict]:
    """Per registered policy: its rule, its schedule, its last run and its backlog
    (read by ``cleanup.observability.overview``), JSON-safe."""
    now = now or timezone.now()
    rows = []
    for health in overview(now):
        policy = get_policy(health.policy)
        last = Run.objects.filter(policy=policy.name).order_by("-created_at").first()
        age = health.oldest_eligible_age
        rows.append({
            "policy": policy.name,
            "model": policy.model_label,
            "mutation": policy.mutation,
            "scheme": policy.scheme,
            "schedule": health.schedule.cron,
            "schedule_installed": health.schedule.installed,
            "window": window_size(policy),
            "last_run": None if last is None else {
                "run_id": str(last.id), "state": last.state,
                "created_at": last.created_at.isoformat(),
                "finished_at": last.finished_at.isoformat() if last.finished_at else None,
            },
            "last_success": None if health.last_success is None else {
                "run_id": str(health.last_success.id),
                "finished_at": health.last_success.finished_at.isoformat(),
            },
            "backlog": {
                "eligible_rows": health.eligible_rows,
                "capped": health.eligible_at_least,  # counting stopped: at least that many
                "oldest_eligible_since": (health.oldest_eligible_since.isoformat()
                                          if health.oldest_eligible_since else None),
                "oldest_age_seconds": None if age is None else round(age.total_seconds(), 3),
            },
            "dead_letters": health.dead_letters,
        })
    return rows


def gone_policy_halts(now: datetime | None = None) -> list[dict]:
    """Per policy no longer registered with halts still open: the halts and the command
    that ends them, JSON-safe (``gone_policy_halts`` in the commands' --json)."""
    return [gone.fields() for gone in gone_policies(now)]
