from cleanup import operations
from cleanup.exceptions import CleanupError
from cleanup.management.base import CleanupCommand, count
from cleanup.models import Chunk
from cleanup.status import get_run


class Command(CleanupCommand):
    help = ("Send dead-lettered chunks to the queue again: a run's (or the named ones), "
            "or every dead letter of one failure class after its cause was fixed.")

    def add_arguments(self, parser) -> None:
        super().add_arguments(parser)
        parser.add_argument("run_id", nargs="?", metavar="RUN_ID",
                            help="The run: its id or a unique prefix of it, as the admin "
                            "shows it.")
        parser.add_argument("--chunk", type=int, action="append", dest="chunks",
                            metavar="ID", help="Only this chunk of the run (repeatable).")
        parser.add_argument("--class", dest="failure_class",
                            choices=Chunk.FailureClass.values,
                            help="Only dead letters of this failure class (any run if no "
                            "RUN_ID is given).")

    def run(self, *, run_id, chunks, failure_class, **options) -> dict:
        if run_id is None and failure_class is None:
            raise CleanupError("give a RUN_ID, or --class to requeue one class everywhere")
        if run_id is None and chunks:
            raise CleanupError("--chunk needs the RUN_ID its ids belong to")
        dead = Chunk.objects.filter(state=Chunk.State.DEAD_LETTERED)
        if failure_class:
            dead = dead.filter(failure_class=failure_class)
        if run_id is None:
            pks = list(dead.values_list("pk", flat=True))
        else:
            run = get_run(run_id)
            pks = operations.chunk_pks(run, chunks) if chunks else list(
                dead.filter(run=run).values_list("pk", flat=True))
        result = operations.requeue(pks, actor="command")
        return {"run_id": run_id, "failure_class": failure_class,
                "requeued": result.done, "skipped": result.skipped}

    def describe(self, result: dict, verbosity: int) -> str:
        scope = f"of run {result['run_id']}" if result["run_id"] else "in all runs"
        if result["failure_class"]:
            scope += f" (class {result['failure_class']})"
        return (f"Requeued {count(result['requeued'], 'chunk')} {scope}; skipped "
                f"{result['skipped']} that were not dead-lettered.")
