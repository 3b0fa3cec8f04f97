import sys
from contextlib import nullcontext, redirect_stdout

from django.core.management.base import CommandError

from cleanup.host import CleanupCommand, count
from reservations import reminders
from reservations.exceptions import SendingStopped


class Command(CleanupCommand):
    help = ("Send the ready renewal reminders now, each once, as the scheduled sender "
            "(cleanup:send-reminders) does every minute.")
    failures: list[tuple[int, int, str]] = []  # the last run's, set by run()

    def add_arguments(self, parser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--batch", type=int, default=None,
                            help="Reminders to take at most (default "
                            "RESERVATIONS_REMINDER_SEND_BATCH).")

    def run(self, *, batch, **options) -> dict:
        if batch is not None and batch < 1:
            raise CommandError("--batch must be at least 1")
        # Under --json stdout is one JSON object: a backend that prints its mails there
        # (the console backend, built with the sys.stdout of the moment) prints them on
        # stderr instead.
        with redirect_stdout(sys.stderr) if options["json"] else nullcontext():
            try:
                report = reminders.send_reminders(batch=batch)
            except SendingStopped as exc:
                sent = count(exc.outcomes.get(reminders.SENT, 0), "reminder")
                raise CommandError(f"sending stopped: {exc}; {sent} sent before it; the "
                                   "rest stay ready for the next run") from exc
        self.failures = report.failures
        outcomes = report.outcomes
        return {"sent": outcomes.get(reminders.SENT, 0),
                "not_sent": {k: v for k, v in outcomes.items() if k != reminders.SENT}}

    def describe(self, result: dict, verbosity: int) -> str:
        skipped = ", ".join(f"{n:,} {reason.replace('_', ' ')}"
                            for reason, n in sorted(result["not_sent"].items()))
        lines = [f"Sent {count(result['sent'], 'reminder')}" + (
            f"; not sent: {skipped}." if skipped else ".")]
        lines += [f"Failed: reminder {pk} (hold {hold_id}): {reason}"
                  for pk, hold_id, reason in self.failures]
        return "\n".join(lines)
