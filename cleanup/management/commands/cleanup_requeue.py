from cleanup.engine import operations
from cleanup.engine.operations import get_run
from cleanup.exceptions import CleanupError
from cleanup.management.base import RUN_HELP, CleanupCommand, WholeNumber, count
from cleanup.models import Chunk
from cleanup.observability.status import requeue_preview


class Command(CleanupCommand):
    help = ("Send dead-lettered chunks to the queue again: a run's (or the named ones), "
            "or every dead letter of one failure class after its cause was fixed.")

    def add_arguments(self, parser) -> None:
        super().add_arguments(parser)
        parser.add_argument("run_id", nargs="?", metavar="RUN_ID", help=RUN_HELP)
        parser.add_argument("--chunk", type=WholeNumber(), action="append", dest="chunks",
                            metavar="ID", help="Only this chunk of the run (repeatable).")
        parser.add_argument("--class", dest="failure_class",
                            choices=Chunk.FailureClass.values,
                            help="Only dead letters of this failure class (any run if no "
                            "RUN_ID is given; then it asks first).")
        parser.add_argument("--dry-run", action="store_true",
                            help="Say which chunks would be sent again; change nothing.")
        parser.add_argument("--noinput", "--no-input", action="store_false",
                            dest="interactive", help="Do not ask for confirmation.")

    def run(self, *, run_id, chunks, failure_class, dry_run, **options) -> dict:
        if run_id is None and failure_class is None:
            raise CleanupError("give a RUN_ID, or --class to requeue one class everywhere")
        if run_id is None and chunks:
            raise CleanupError("--chunk needs the RUN_ID its ids belong to")
        dead = Chunk.objects.filter(state=Chunk.State.DEAD_LETTERED)
        if failure_class:
            dead = dead.filter(failure_class=failure_class)
        run = None if run_id is None else get_run(run_id)
        if run is None:
            pks = list(dead.values_list("pk", flat=True))
        else:
            pks = operations.chunk_pks(run, chunks) if chunks else list(
                dead.filter(run=run).values_list("pk", flat=True))
        result = {"run_id": None if run is None else str(run.id),
                  "failure_class": failure_class, "dry_run": dry_run}
        preview = requeue_preview(pks)
        selected = sum(len(ids) for ids in preview.values())
        if dry_run:
            return {**result, "would_requeue": selected, "chunks": preview,
                    "skipped": len(pks) - selected}
        if run is None and selected:
            # Across every run at once: say how much, and let the operator stop it.
            self.confirm(f"Requeue {count(selected, 'dead-lettered chunk')} of class "
                         f"{failure_class} in {count(len(preview), 'run')}?", options)
        done = operations.requeue(pks, actor="command")
        return {**result, "requeued": done.done, "skipped": done.skipped}

    def describe(self, result: dict, verbosity: int) -> str:
        scope = f"of run {result['run_id']}" if result["run_id"] else "in all runs"
        if result["failure_class"]:
            scope += f" (class {result['failure_class']})"
        if result["dry_run"]:
            lines = [f"Dry run: would requeue {count(result['would_requeue'], 'chunk')} {scope}"
                     f"; {result['skipped']} selected are not dead-lettered (or their run "
                     "was cancelled). Nothing changed."]
            lines += [f"  run {run_id}: {_numbered(ids)}"
                      for run_id, ids in result["chunks"].items()]
            return "\n".join(lines)
        return (f"Requeued {count(result['requeued'], 'chunk')} {scope}; skipped "
                f"{result['skipped']} that were not dead-lettered.")


def _numbered(chunk_ids: list[int], shown: int = 10) -> str:
    """``chunks #1, #4`` (the first ten of a long list, then how many more)."""
    text = ", ".join(f"#{n}" for n in chunk_ids[:shown])
    more = len(chunk_ids) - shown
    return f"{count(len(chunk_ids), 'chunk')}: {text}" + (f" and {more:,} more" if more > 0
                                                          else "")
