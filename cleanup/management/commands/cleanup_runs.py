from datetime import datetime, timedelta

from django.utils import timezone

from cleanup.display import number, utc_text
from cleanup.exceptions import UnknownPolicy
from cleanup.management.base import CleanupCommand, Since, WholeNumber
from cleanup.models import Run
from cleanup.observability.status import run_summary
from cleanup.policies import get_policy

# Each listed run costs a few queries: a list stays one screenful of pages at most.
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
        return {"runs": [_row(run) for run in runs[:limit]], "total": runs.count()}

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


def _known(policy: str) -> None:
    """Refuse a policy name that is not registered and names no run either (a typo); a
    policy since removed still lists the runs it left."""
    try:
        get_policy(policy)
    except UnknownPolicy:
        if not Run.objects.filter(policy=policy).exists():
            raise


def _row(run: Run) -> dict:
    summary = run_summary(run)
    by_state = summary["chunks"]
    done = by_state["committed"] + by_state["acknowledged"]
    return {
        "run_id": summary["run_id"], "policy": run.policy, "scheme": run.scheme,
        "state": run.state, "trigger": run.trigger, "cutoff": summary["cutoff"],
        "planned_all": run.planned_all,
        "chunks": {**by_state, "done": done},
        "mutation": summary["mutation"], "rows_changed": summary["rows_changed"],
        "rows_deleted": summary["rows_deleted"], "rows_updated": summary["rows_updated"],
        "created_at": summary["created_at"],
        "finished_at": summary["finished_at"],
    }
