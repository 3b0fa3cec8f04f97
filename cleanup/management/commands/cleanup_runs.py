from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Count, Sum
from django.utils import timezone

from cleanup.display import number, utc_text
from cleanup.exceptions import UnknownPolicy
from cleanup.management.base import CleanupCommand, Since, WholeNumber
from cleanup.models import Chunk, Run, rows_changed
from cleanup.observability.status import mutation
from cleanup.policies import get_policy

# Any list costs the same few queries (the runs, their chunks' totals, at most one
# count): the bound keeps the output, and the ids sent back for the totals, in reason.
MAX_LIMIT = 10_000
# An age reaches back at most a century (a timestamp can reach further).
MAX_AGE = timedelta(days=36_500)


class Command(CleanupCommand):
    help = ("List recent runs, newest first, with their state and what they did "
            "(cleanup_status shows one run in full).")

    def add_arguments(self, parser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--policy", help="Only runs of this policy.")
        parser.add_argument("--state", choices=Run.State.values, help="Only runs in this state.")
        parser.add_argument("--since", type=Since(MAX_AGE),
                            help="Only runs created since then: an ISO-8601 timestamp with "
                            "offset, or an age such as 30m, 6h or 2d (at most 36,500d).")
        parser.add_argument("--limit", type=WholeNumber(1, MAX_LIMIT), default=20,
                            help=f"At most this many runs (default 20, at most "
                            f"{MAX_LIMIT:,}).")
        parser.add_argument("--found-work", action="store_true",
                            help="Leave out runs that found nothing to do.")

    def run(self, *, policy, state, since, limit, found_work, **options) -> dict:
        runs = Run.objects.order_by("-created_at")
        if policy is not None:
            _known(policy)
            runs = runs.filter(policy=policy)
        if state:
            runs = runs.filter(state=state)
        if since is not None:
            if isinstance(since, timedelta):
                since = timezone.now() - since
            runs = runs.filter(created_at__gte=since)
        if found_work:
            runs = runs.exclude(chunks_planned=0, state__in=Run.FINISHED)
        listed = list(runs[:limit])
        # Only a full page can have runs behind it that the total must count.
        total = runs.count() if len(listed) == limit else len(listed)
        totals = _chunk_totals([run.pk for run in listed])
        return {"runs": [_row(run, totals[run.pk]) for run in listed], "total": total}

    def describe(self, result: dict, verbosity: int) -> str:
        if not result["runs"]:
            return ("No runs match." if result["total"] == 0 and Run.objects.exists()
                    else "No runs yet: nothing has been dispatched.")
        lines = [f"{'run':<38}{'policy':<26}{'scheme':<8}{'state':<30}{'chunks':>15}"
                 f"{'changed':>12}  created"]
        for run in result["runs"]:
            chunks = f"{number(run['chunks']['done'])}/{number(run['chunks']['total'])}"
            if not run["planned_all"]:
                chunks += "+"
            lines.append(f"{run['run_id']:<38}{run['policy']:<26}{run['scheme']:<8}"
                         f"{run['state']:<30}{chunks:>15}{number(run['rows_changed']):>12}  "
                         f"{utc_text(datetime.fromisoformat(run['created_at']))}")
        shown = len(result["runs"])
        if result["total"] > shown:
            lines.append(f"({shown} of {result['total']} runs; --limit for more)")
        return "\n".join(lines)


def _known(policy_name: str) -> None:
    """Refuse a policy name that is not registered and names no run either (a typo); a
    policy since removed still lists the runs it left."""
    try:
        get_policy(policy_name)
    except UnknownPolicy:
        if not Run.objects.filter(policy=policy_name).exists():
            raise


def _chunk_totals(run_ids: list) -> dict:
    """Per run id: its chunks by state and the rows they deleted and updated, read in one
    query over those runs' chunks alone (as ``run_summary`` reads them for one run)."""
    states = Chunk.State.values  # a new list at each read: once, not once a run
    totals = {run_id: {"chunks": dict.fromkeys(states, 0), "rows_deleted": 0,
                       "rows_updated": 0} for run_id in run_ids}
    per_state = (Chunk.objects.filter(run_id__in=run_ids).order_by()
                 .values_list("run_id", "state")
                 .annotate(n=Count("pk"), deleted=Sum("rows_deleted"),
                           updated=Sum("rows_updated")))
    for run_id, state, n, deleted, updated in per_state:
        figures = totals[run_id]
        figures["chunks"][state] = n
        figures["rows_deleted"] += deleted
        figures["rows_updated"] += updated
    return totals


def _row(run: Run, totals: dict) -> dict:
    by_state = totals["chunks"]
    return {
        "run_id": str(run.id), "policy": run.policy, "scheme": run.scheme,
        "state": run.state, "trigger": run.trigger,
        "cutoff": run.cutoff.isoformat(timespec="microseconds"),
        "planned_all": run.planned_all,
        "chunks": {**by_state, "total": sum(by_state.values()),
                   "done": sum(by_state[state] for state in Chunk.DONE)},
        "mutation": mutation(run, totals["rows_updated"]),
        "rows_changed": rows_changed(totals),
        "rows_deleted": totals["rows_deleted"], "rows_updated": totals["rows_updated"],
        "created_at": run.created_at.isoformat(),
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
    }
