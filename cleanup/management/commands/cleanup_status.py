from cleanup.display import duration, number
from cleanup.engine.operations import get_run, latest_run
from cleanup.exceptions import CleanupError, UnknownRun
from cleanup.management.base import CleanupCommand, count, gone_policy_lines
from cleanup.observability.status import gone_policy_halts, run_summary
from cleanup.observability.waits import why_it_waits, working_seconds

NO_RUN_YET = ("No run yet: dispatch one with manage.py cleanup_dispatch --policy NAME "
              "(manage.py cleanup_policies lists them), or let the schedules start them: "
              "manage.py cleanup_schedule, then a manage.py qcluster running.")


class Command(CleanupCommand):
    help = ("Show one run's state and its chunks' totals (default: the latest run), and "
            "the halts still open of any policy no longer registered.")

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
        if chosen is not None:
            run = get_run(chosen)
        else:
            try:
                run = latest_run()
            except UnknownRun:
                # Nothing has failed: a new install has simply not run anything yet.
                return {"run_id": None, "state": None, "note": NO_RUN_YET,
                        "gone_policy_halts": gone_policy_halts()}
        return {**run_summary(run), "gone_policy_halts": gone_policy_halts(),
                # Beside "halted" (its policy's halts): what else the run waits on now.
                "waiting": why_it_waits(run, halted=False),
                "worked_seconds": round(working_seconds(run), 3)}

    def describe(self, result: dict, verbosity: int) -> str:
        if result["run_id"] is None:
            gone = gone_policy_lines(result["gone_policy_halts"])
            return "\n".join([result["note"], *(["", *gone] if gone else [])])
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
        if result["rows_locked"]:
            lines.append(f"  skipped: locked {result['rows_locked']:,} (kept locked by another "
                         "transaction past CLEANUP_ROW_LOCK_WAIT_MS; a later run takes them)")
        lines += [f"  {halt}: nothing new is planned until it is resumed"
                  for halt in result["halted"]]
        lines += [f"  waiting: {reason}" for reason in result["waiting"]]
        if result["rows_changed"] and result["worked_seconds"]:
            rate = round(result["rows_changed"] / result["worked_seconds"])
            lines.append(f"  {number(rate)} rows/s over {duration(result['worked_seconds'])} "
                         "of work (time it was stuck or waiting left out)")
        if verbosity > 1:
            lines.append(f"  key {result['dispatch_key']}, trigger {result['trigger']}, "
                         f"replay of {result['replay_of'] or '-'}")
        if result["gone_policy_halts"]:
            lines += ["", *gone_policy_lines(result["gone_policy_halts"])]
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
