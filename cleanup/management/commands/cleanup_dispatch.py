from __future__ import annotations

import logging
import time
from contextlib import contextmanager

from cleanup.cutoffs import parse_cutoff
from cleanup.display import number
from cleanup.engine.dispatch import dispatch, dispatch_in_process, preview_dispatch
from cleanup.management.base import CleanupCommand, count
from cleanup.observability.status import run_summary
from cleanup.policies import SCHEMES


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
                            help="Apply the run's chunks in this process, taking their "
                            "messages from the queue as a worker would; what it does not "
                            "finish is the queue's.")
        parser.add_argument("--dry-run", action="store_true",
                            help="Count what would be planned; write nothing.")

    def run(self, *, policy, scheme, cutoff, key, sync, dry_run, **options) -> dict:
        started = time.monotonic()
        # --sync: one progress line on stderr instead of a log line per chunk.
        show = sync and not options["json"] and self.stderr.isatty()
        cutoff = None if cutoff is None else parse_cutoff(cutoff)
        with quiet_chunk_logs(sync):
            if dry_run:
                result = preview_dispatch(policy, scheme=scheme, cutoff=cutoff)
            elif sync:
                result = dispatch_in_process(policy, scheme=scheme, cutoff=cutoff, key=key,
                                             progress=self._progress if show else None)
            else:
                result = dispatch(policy, scheme=scheme, cutoff=cutoff, key=key)
        if show:
            self.stderr.write("", style_func=str)
        # By state with a total, as in every command; a dry run has only the total.
        chunks = (run_summary(result.run)["chunks"] if result.run
                  else {"total": result.chunks})
        return {**result.fields(), "chunks": chunks,
                "seconds": round(time.monotonic() - started, 3)}

    def _progress(self, chunks: int, rows: int, eligible: int | None) -> None:
        of = "" if eligible is None else f" of {number(eligible)}"
        self.stderr.write(f"\rApplied {count(chunks, 'chunk')}: {number(rows)}{of} rows changed",
                          ending="", style_func=str)
        self.stderr.flush()

    def describe(self, result: dict, verbosity: int) -> str:
        if result["dry_run"]:
            return result["summary"]
        return f"{result['summary']} State {result['state']}; took {result['seconds']:.1f} s."


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
