from cleanup.engine import operations
from cleanup.engine.operations import get_run
from cleanup.management.base import RUN_HELP, CleanupCommand, WholeNumber, count


class Command(CleanupCommand):
    help = "Give up on dead-lettered chunks of a run, for a stated reason."

    def add_arguments(self, parser) -> None:
        super().add_arguments(parser)
        parser.add_argument("run_id", metavar="RUN_ID",
                            help=RUN_HELP)
        parser.add_argument("--chunk", type=WholeNumber(), action="append", dest="chunks",
                            metavar="ID", required=True, help="Chunk id (repeatable).")
        parser.add_argument("--reason", required=True, help="Why; kept on the chunk.")
        parser.add_argument("--noinput", "--no-input", action="store_false",
                            dest="interactive", help="Do not ask for confirmation.")

    def run(self, *, run_id, chunks, reason, **options) -> dict:
        run = get_run(run_id)
        pks = operations.chunk_pks(run, chunks)
        reason = operations.discard_reason(reason)
        self.confirm(f"Discard {count(len(pks), 'chunk')} of run {run.id}?", options)
        result = operations.discard(pks, reason, actor="command")
        return {"run_id": str(run.id), "discarded": result.done, "skipped": result.skipped}

    def describe(self, result: dict, verbosity: int) -> str:
        return (f"Discarded {count(result['discarded'], 'chunk')} of run {result['run_id']}; "
                f"skipped {result['skipped']} that were not dead-lettered.")
