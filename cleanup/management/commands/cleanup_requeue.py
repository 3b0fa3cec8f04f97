from cleanup import operations
from cleanup.management.base import CleanupCommand
from cleanup.models import Chunk
from cleanup.status import get_run


class Command(CleanupCommand):
    help = "Send a run's dead-lettered chunks (or the named ones) to the queue again."

    def add_arguments(self, parser) -> None:
        super().add_arguments(parser)
        parser.add_argument("run_id")
        parser.add_argument("--chunk", type=int, action="append", dest="chunks",
                            metavar="ID", help="Only this chunk (repeatable). Default: "
                            "every dead-lettered chunk of the run.")

    def run(self, *, run_id, chunks, **options) -> dict:
        run = get_run(run_id)
        pks = operations.chunk_pks(run, chunks, state=Chunk.State.DEAD_LETTERED)
        result = operations.requeue(pks, actor="command")
        return {"run_id": str(run.id), "requeued": result.done, "skipped": result.skipped}

    def describe(self, result: dict, verbosity: int) -> str:
        return (f"Requeued {result['requeued']} chunks of run {result['run_id']}; "
                f"skipped {result['skipped']} that were not dead-lettered.")
