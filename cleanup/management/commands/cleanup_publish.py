from cleanup.management.base import MAX_INTEGER, CleanupCommand, WholeNumber, count
from cleanup.models import Event
from cleanup.outbox.publisher import publish


class Command(CleanupCommand):
    help = ("Deliver the outbox's pending events that are due, each to the handler "
            "registered for its name, until none is left to take or --limit were handled.")

    def add_arguments(self, parser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--limit", type=WholeNumber(), metavar="N",
                            help="Handle at most N events (default: all that are due).")

    def run(self, *, limit, **options) -> dict:
        result = publish(limit or MAX_INTEGER)
        pending = Event.objects.filter(state=Event.State.PENDING).count()
        return {**result.as_dict(), "pending": pending}

    def describe(self, result: dict, verbosity: int) -> str:
        if not result["handled"] and not result["skipped_busy"]:
            text = "No event was due."
        else:
            text = (f"Handled {count(result['handled'], 'event')}: {result['delivered']:,} "
                    f"delivered, {result['failed']:,} failed (taken again after a back-off), "
                    f"{result['dead']:,} dead-lettered; {result['skipped_busy']:,} skipped "
                    "(held by another publisher).")
        if result["pending"]:
            text += (f" {count(result['pending'], 'event')} still pending (not due yet, or "
                     "behind an earlier event of their ordering key).")
        return text
