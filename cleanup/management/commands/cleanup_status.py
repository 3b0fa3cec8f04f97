from cleanup.management.base import CleanupCommand, count
from cleanup.status import get_run, latest_run, run_summary


class Command(CleanupCommand):
    help = "Show one run's state and its chunks' totals (default: the latest run)."

    def add_arguments(self, parser) -> None:
        super().add_arguments(parser)
        parser.add_argument("run_id", nargs="?", metavar="RUN_ID",
                            help="The run: its id or a unique prefix of it, as the admin "
                            "shows it; default: the latest run.")
        parser.add_argument("--run", dest="run_option", metavar="RUN_ID",
                            help="The same as RUN_ID (kept for scripts written before).")

    def run(self, *, run_id, run_option, **options) -> dict:
        chosen = run_id if run_id is not None else run_option
        return run_summary(latest_run() if chosen is None else get_run(chosen))

    def describe(self, result: dict, verbosity: int) -> str:
        chunks = ", ".join(f"{state} {n}" for state, n in result["chunks"].items()
                           if state != "total" and (n or verbosity > 1))
        lines = [
            f"Run {result['run_id']} ({result['policy']}, {result['scheme']}): {result['state']}",
            f"  cutoff {result['cutoff']}, {count(result['candidates'], 'candidate')}, "
            f"{count(result['chunks_planned'], 'chunk')}" + _planning(result),
            f"  chunks: {chunks or 'none'}",
            f"  {count(result['rows_changed'], 'row')} {result['mutation']}d, "
            f"{result['items_skipped']} skipped "
            f"(no longer eligible), {result['noops']} no-op deliveries of "
            f"{result['deliveries']}",
        ]
        if verbosity > 1:
            lines.append(f"  key {result['dispatch_key']}, trigger {result['trigger']}, "
                         f"replay of {result['replay_of'] or '-'}")
        return "\n".join(lines)


def _planning(result: dict) -> str:
    """Where a run that still plans as it goes has got to."""
    if result["planned_all"]:
        return " (all planned)"
    text = " planned so far"
    if result["position"] is not None:
        text += f", {result['position']:.0%} through its span"
    if result["estimated_remaining_rows"] is not None:
        text += f", about {result['estimated_remaining_rows']} rows to go"
    return text + f" (window {result['window']})"
