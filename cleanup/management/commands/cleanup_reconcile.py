from cleanup.management.base import CleanupCommand
from cleanup.reconcile import reconcile


class Command(CleanupCommand):
    help = ("Re-send chunks of running runs that were never sent or have been silent for "
            "a whole lease (a lost message). Also runs every minute from the schedule.")

    def run(self, **options) -> dict:
        result = reconcile()
        return {"resent": result.resent, "never_sent": result.never_sent}

    def describe(self, result: dict, verbosity: int) -> str:
        return (f"Re-sent {result['resent']} chunks ({result['never_sent']} had never been "
                "sent).")
