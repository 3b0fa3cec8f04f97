from cleanup.display import number
from cleanup.engine.operations import get_run
from cleanup.management.base import RUN_HELP, CleanupCommand, WholeNumber
from cleanup.models import Chunk
from cleanup.observability.status import chunk_rows

# A cause longer than this is cut in the table (the whole one is in --json and the admin).
CAUSE_WIDTH = 100


class Command(CleanupCommand):
    help = ("List one run's chunks in order: state, rows changed, deliveries and the cause "
            "of the last error (or why the engine dead-lettered it).")

    def add_arguments(self, parser) -> None:
        super().add_arguments(parser)
        parser.add_argument("run_id", metavar="RUN_ID", help=RUN_HELP)
        parser.add_argument("--state", choices=Chunk.State.values,
                            help="Only chunks in this state.")
        parser.add_argument("--limit", type=WholeNumber(), default=None,
                            help="At most this many chunks, the first by id (default: all).")

    def run(self, *, run_id, state, limit, **options) -> dict:
        return chunk_rows(get_run(run_id), state=state, limit=limit)

    def describe(self, result: dict, verbosity: int) -> str:
        which = f" {result['state']}" if result["state"] else ""
        if not result["chunks"]:
            return f"Run {result['run_id']} ({result['policy']}) has no{which} chunks."
        lines = [f"Run {result['run_id']} ({result['policy']}):",
                 f"{'chunk':>7}  {'state':<14}{'changed':>12}{'deliveries':>12}  cause"]
        for chunk in result["chunks"]:
            cause = (chunk["cause"] or chunk["verdict"]).strip().split("\n", 1)[0]
            if cause and chunk["state"] in Chunk.DONE:
                cause = f"earlier: {cause}"  # it committed after all
            if len(cause) > CAUSE_WIDTH:
                cause = cause[:CAUSE_WIDTH - 3] + "..."
            lines.append(f"{'#' + str(chunk['chunk_id']):>7}  {chunk['state']:<14}"
                         f"{number(chunk['rows_changed']):>12}"
                         f"{number(chunk['deliveries']):>12}  {cause or '-'}")
        shown = len(result["chunks"])
        if result["total"] > shown:
            lines.append(f"({number(shown)} of {number(result['total'])}{which} chunks; a higher "
                         "--limit shows more)")
        return "\n".join(lines)
