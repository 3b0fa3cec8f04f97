from datetime import timedelta

from django.utils import timezone

from cleanup.cutoffs import parse_cutoff
from cleanup.exceptions import BadCutoff, CleanupError
from cleanup.management.base import CleanupCommand
from cleanup.models import Run
from cleanup.status import run_summary

UNITS = {"m": "minutes", "h": "hours", "d": "days"}


class Command(CleanupCommand):
    help = ("List recent runs, newest first, with their state and what they did "
            "(cleanup_status shows one run in full).")

    def add_arguments(self, parser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--policy", help="Only runs of this policy.")
        parser.add_argument("--state", choices=Run.State.values, help="Only runs in this state.")
        parser.add_argument("--since", help="Only runs created since then: an ISO-8601 "
                            "timestamp with offset, or an age such as 30m, 6h or 2d.")
        parser.add_argument("--limit", type=int, default=20,
                            help="At most this many runs (default 20).")
        parser.add_argument("--found-work", action="store_true",
                            help="Leave out runs that found nothing to do.")

    def run(self, *, policy, state, since, limit, found_work, **options) -> dict:
        if limit < 1:
            raise CleanupError(f"--limit must be at least 1, not {limit}")
        runs = Run.objects.order_by("-created_at")
        if policy:
            runs = runs.filter(policy=policy)
        if state:
            runs = runs.filter(state=state)
        if since is not None:
            runs = runs.filter(created_at__gte=_since(since))
        if found_work:
            runs = runs.exclude(chunks_planned=0, state__in=Run.FINISHED)
        return {"runs": [_row(run) for run in runs[:limit]], "total": runs.count()}

    def describe(self, result: dict, verbosity: int) -> str:
        if not result["runs"]:
            return ("No runs match." if result["total"] == 0 and Run.objects.exists()
                    else "No runs yet: nothing has been dispatched.")
        lines = [f"{'run':<10}{'policy':<26}{'scheme':<8}{'state':<30}{'chunks':>12}"
                 f"{'changed':>10}  created"]
        for run in result["runs"]:
            chunks = f"{run['chunks']['done']}/{run['chunks']['total']}"
            if not run["planned_all"]:
                chunks += "+"
            lines.append(f"{run['run_id'][:8]:<10}{run['policy']:<26}{run['scheme']:<8}"
                         f"{run['state']:<30}{chunks:>12}{run['rows_changed']:>10}  "
                         f"{run['created_at'][:19]}")
        shown = len(result["runs"])
        if result["total"] > shown:
            lines.append(f"({shown} of {result['total']} runs; --limit for more)")
        return "\n".join(lines)


def _since(text: str):
    text = text.strip()
    if text[:-1].isdigit() and text[-1:] in UNITS:
        return timezone.now() - timedelta(**{UNITS[text[-1]]: int(text[:-1])})
    try:
        return parse_cutoff(text)
    except BadCutoff as exc:
        raise CleanupError(f"--since {text!r}: give an ISO-8601 timestamp with offset or "
                           f"an age such as 30m, 6h or 2d ({exc})") from None


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
