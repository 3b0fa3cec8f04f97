import time

from cleanup.cutoffs import parse_cutoff
from cleanup.dispatch import dispatch
from cleanup.management.base import CleanupCommand
from cleanup.models import Run
from cleanup.policies import SCHEMES


class Command(CleanupCommand):
    help = "Start a cleanup run of one policy: freeze the cutoff, plan chunks, enqueue them."

    def add_arguments(self, parser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--policy", required=True)
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
        result = dispatch(
            policy,
            scheme=scheme,
            cutoff=None if cutoff is None else parse_cutoff(cutoff),
            key=key,
            trigger=Run.Trigger.COMMAND,
            sync=sync,
            dry_run=dry_run,
        )
        return {
            "run_id": str(result.run.id) if result.run else None,
            "created": result.created,
            "dry_run": result.dry_run,
            "policy": result.policy,
            "scheme": result.scheme,
            "cutoff": result.cutoff.isoformat(timespec="microseconds"),
            "candidates": result.candidates,
            "chunks": result.chunks,
            "planned_all": result.planned_all,
            "state": result.run.state if result.run else None,
            "seconds": round(time.monotonic() - started, 3),
        }

    def describe(self, result: dict, verbosity: int) -> str:
        if result["dry_run"]:
            return (f"Dry run: {result['policy']} would plan {result['chunks']} chunks "
                    f"({result['scheme']}) for {result['candidates']} rows eligible at "
                    f"{result['cutoff']}.")
        verb = "Dispatched" if result["created"] else "Already dispatched:"
        if result["planned_all"]:
            planned = (f"{result['chunks']} chunks ({result['scheme']}) for "
                       f"{result['candidates']} rows eligible at {result['cutoff']}")
        else:
            planned = (f"first {result['chunks']} chunks ({result['scheme']}, "
                       f"{result['candidates']} rows eligible at {result['cutoff']}) sent; "
                       "the rest is planned as they finish")
        return (f"{verb} run {result['run_id']} of {result['policy']}: {planned}; state "
                f"{result['state']}; took {result['seconds']:.1f} s.")
