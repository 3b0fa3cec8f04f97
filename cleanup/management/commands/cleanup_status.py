from cleanup.display import number
from cleanup.engine.operations import get_run, latest_run
from cleanup.exceptions import CleanupError
from cleanup.management.base import CleanupCommand, count
from cleanup.observability.status import run_summary


class Command(CleanupCommand):
    help = "Show one run's state and its chunks' totals (default: the latest run)."

    def add_arguments(self, parser) -> None:
        super().add_arguments(parser)
        parser.add_argument("run_id", nargs="?", metavar="RUN_ID",
                            help="The run: its full id or the 8-hex short id the admin "
                            "shows; default: the latest run.")
        parser.add_argument("--run", dest="run_option", metavar="RUN_ID",
                            help="The same as RUN_ID (kept for scripts written before).")

    def run(self, *, run_id, run_option, **options) -> dict:
        if run_id is not None and run_option is not None:
            raise CleanupError(f"give one run, not two: RUN_ID {run_id!r} or --run "
                               f"{run_option!r}")
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
            f"(no longer eligible), {result['noop_deliveries']} no-op deliveries of "
            f"{result['deliveries']}",
        ]
        lines += [f"  {hold}: nothing new is planned until it is resumed"
                  for hold in result["held"]]
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
        text += f", about {number(result['estimated_remaining_rows'])} rows to go"
    return text + f" (window {result['window']})"
