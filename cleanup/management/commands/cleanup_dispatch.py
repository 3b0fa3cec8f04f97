import logging
import time
from contextlib import contextmanager

from cleanup.cutoffs import parse_cutoff
from cleanup.dispatch import dispatch
from cleanup.management.base import CleanupCommand, count
from cleanup.models import Run
from cleanup.policies import SCHEMES
from cleanup.status import run_summary


class Command(CleanupCommand):
    help = "Start a cleanup run of one policy: freeze the cutoff, plan chunks, enqueue them."

    def add_arguments(self, parser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--policy", required=True,
                            help="The registered policy to run (cleanup_status lists runs; "
                            "the admin's overview lists policies).")
        parser.add_argument("--scheme", choices=SCHEMES, help="Default: the policy's own.")
        parser.add_argument("--cutoff", help="ISO-8601 with offset, not in the future. "
                            "Default: now.")
        parser.add_argument("--key", help="Dispatch key; a run that already has it is "
                            "returned instead of starting another.")
        parser.add_argument("--sync", action="store_true",
                            help="Apply the chunks in this process, without the queue.")
        parser.add_argument("--dry-run", action="store_true",
                            help="Count what would be planned; write nothing.")

    def run(self, *, policy, scheme, cutoff, key, sync, dry_run, **options) -> dict:
        started = time.monotonic()
        # --sync: one progress line on stderr instead of a log line per chunk.
        show = sync and not options["json"] and self.stderr.isatty()
        with quiet_chunk_logs(sync):
            result = dispatch(
                policy,
                scheme=scheme,
                cutoff=None if cutoff is None else parse_cutoff(cutoff),
                key=key,
                trigger=Run.Trigger.COMMAND,
                sync=sync,
                dry_run=dry_run,
                progress=self._progress if show else None,
            )
        if show:
            self.stderr.write("", style_func=str)
        return {
            "run_id": str(result.run.id) if result.run else None,
            "created": result.created,
            "dry_run": result.dry_run,
            "policy": result.policy,
            "scheme": result.scheme,
            "cutoff": result.cutoff.isoformat(timespec="microseconds"),
            "candidates": result.candidates,
            # By state with a total, as in every command; a dry run has only the total.
            "chunks": (run_summary(result.run)["chunks"] if result.run
                       else {"total": result.chunks}),
            "planned_all": result.planned_all,
            "state": result.run.state if result.run else None,
            "seconds": round(time.monotonic() - started, 3),
        }

    def _progress(self, chunks: int, rows: int) -> None:
        self.stderr.write(f"\rApplied {count(chunks, 'chunk')}, {count(rows, 'row')} changed",
                          ending="", style_func=str)
        self.stderr.flush()

    def describe(self, result: dict, verbosity: int) -> str:
        if result["dry_run"]:
            return (f"Dry run: {result['policy']} would plan "
                    f"{count(result['chunks']['total'], 'chunk')} "
                    f"({result['scheme']}) for {count(result['candidates'], 'row')} eligible at "
                    f"{result['cutoff']}.")
        verb = "Dispatched" if result["created"] else "Already dispatched:"
        if result["planned_all"]:
            planned = (f"{count(result['chunks']['total'], 'chunk')} ({result['scheme']}) for "
                       f"{count(result['candidates'], 'row')} eligible at {result['cutoff']}")
        else:
            planned = (f"first {count(result['chunks']['total'], 'chunk')} ({result['scheme']}, "
                       f"{count(result['candidates'], 'row')} eligible at {result['cutoff']}) "
                       "sent; the rest is planned as they finish")
        return (f"{verb} run {result['run_id']} of {result['policy']}: {planned}; state "
                f"{result['state']}; took {result['seconds']:.1f} s.")


@contextmanager
def quiet_chunk_logs(quiet: bool):
    """Chunk-by-chunk INFO lines off while a --sync run applies its chunks here."""
    loggers = [logging.getLogger(name) for name in
               ("cleanup.worker", "cleanup.ledger", "cleanup.window", "django-q")]
    levels = [logger.level for logger in loggers]
    if quiet:
        for logger in loggers:
            logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
