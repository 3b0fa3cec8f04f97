from django.core.management.base import CommandError

from cleanup.engine import operations
from cleanup.engine.operations import get_run
from cleanup.management.base import RUN_HELP, CleanupCommand
from cleanup.models import Run


class Command(CleanupCommand):
    help = ("Cancel a running run: its unfinished chunks are cancelled and later "
            "deliveries of them change nothing. Committed work stays.")

    def add_arguments(self, parser) -> None:
        super().add_arguments(parser)
        parser.add_argument("run_id", metavar="RUN_ID",
                            help=RUN_HELP)
        parser.add_argument("--noinput", "--no-input", action="store_false",
                            dest="interactive", help="Do not ask for confirmation.")

    def run(self, *, run_id, **options) -> dict:
        run = get_run(run_id)
        if run.state not in (Run.State.RUNNING, Run.State.CANCELLED):
            raise CommandError(f"run {run.id} is already {run.state}; nothing to cancel")
        if run.state == Run.State.RUNNING:
            self.confirm(f"Cancel run {run.id} of {run.policy}?", options)
        result = operations.cancel([run.pk], actor="command")
        run.refresh_from_db()
        return {"run_id": str(run.id), "cancelled": bool(result.done), "state": run.state}

    def describe(self, result: dict, verbosity: int) -> str:
        if result["cancelled"]:
            return f"Cancelled run {result['run_id']}."
        return f"Run {result['run_id']} was already cancelled; nothing changed."
