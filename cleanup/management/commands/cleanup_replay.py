from cleanup.cutoffs import parse_cutoff
from cleanup.engine import operations
from cleanup.engine.replay import replay
from cleanup.exceptions import CleanupError
from cleanup.management.base import RUN_HELP, CleanupCommand, WholeNumber, count
from cleanup.models import Run


class Command(CleanupCommand):
    help = (
        "Re-send a run's chunks with its own cutoff (committed ones turn into no-ops), "
        "or start a new linked run with --new-cutoff."
    )

    def add_arguments(self, parser) -> None:
        super().add_arguments(parser)
        parser.add_argument("run_id", metavar="RUN_ID",
                            help=RUN_HELP)
        parser.add_argument("--chunk", type=WholeNumber(), action="append", dest="chunks",
                            metavar="ID", help="Only this chunk (repeatable).")
        parser.add_argument("--new-cutoff", help="ISO-8601 with offset, not in the future "
                            "and not before the run's own cutoff.")

    def run(self, *, run_id, chunks, new_cutoff, **options) -> dict:
        if chunks and new_cutoff is not None:
            raise CleanupError("--chunk and --new-cutoff cannot be combined")
        result = replay(
            run_id,
            chunk_ids=chunks or operations.ALL_CHUNKS,  # no --chunk: the whole run
            new_cutoff=None if new_cutoff is None else parse_cutoff(new_cutoff, "new cutoff"),
            trigger=Run.Trigger.REPLAY,
        )
        return {
            "run_id": str(result.run.id),
            "replay_of": str(result.run.replay_of_id) if result.run.replay_of_id else None,
            "created": result.created,
            "resent": result.resent,
            "skipped": result.skipped,
            "cutoff": result.run.cutoff.isoformat(timespec="microseconds"),
        }

    def describe(self, result: dict, verbosity: int) -> str:
        if result["replay_of"] and result["created"]:
            return (f"Started run {result['run_id']} (replay of {result['replay_of']}) "
                    f"with cutoff {result['cutoff']}: {count(result['resent'], 'chunk')} sent.")
        return (f"Re-sent {count(result['resent'], 'chunk')} of run {result['run_id']} with cutoff "
                f"{result['cutoff']}; skipped {result['skipped']} discarded or cancelled.")
