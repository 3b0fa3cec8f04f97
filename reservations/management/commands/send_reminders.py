from django.core.management.base import CommandError

from cleanup.management.base import CleanupCommand, count
from reservations import reminders


class Command(CleanupCommand):
    help = ("Send the ready renewal reminders now, each once, as the scheduled sender "
            "(cleanup:send-reminders) does every minute.")

    def add_arguments(self, parser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--batch", type=int, default=None,
                            help="Reminders to take at most (default "
                            "RESERVATIONS_REMINDER_SEND_BATCH).")

    def run(self, *, batch, **options) -> dict:
        if batch is not None and batch < 1:
            raise CommandError("--batch must be at least 1")
        try:
            outcomes = reminders.send_ready_reminders(batch=batch)
        except OSError as exc:  # the mail server refused or is unreachable
            raise CommandError(f"sending failed ({exc}); the reminder stays ready for the "
                               "next run") from exc
        return {"sent": outcomes.get(reminders.SENT, 0),
                "not_sent": {k: v for k, v in outcomes.items() if k != reminders.SENT}}

    def describe(self, result: dict, verbosity: int) -> str:
        skipped = ", ".join(f"{n} {reason.replace('_', ' ')}"
                            for reason, n in sorted(result["not_sent"].items()))
        return f"Sent {count(result['sent'], 'reminder')}" + (
            f"; not sent: {skipped}." if skipped else ".")
