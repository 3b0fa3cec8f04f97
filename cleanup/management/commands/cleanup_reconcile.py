from cleanup.engine.reconcile import reconcile
from cleanup.management.base import CleanupCommand, count


class Command(CleanupCommand):
    help = ("Re-send chunks of running runs that were never sent or have been silent for "
            "a whole redelivery window (a lost message), and plan chunks for runs whose "
            "window has room nobody filled. Also runs every minute from the schedule.")

    def run(self, **options) -> dict:
        result = reconcile()
        return {"resent": result.resent, "never_sent": result.never_sent,
                "planned": result.planned}

    def describe(self, result: dict, verbosity: int) -> str:
        text = (f"Re-sent {count(result['resent'], 'chunk')} ({result['never_sent']} had never "
                "been sent).")
        if result["planned"]:
            text += f" Planned {count(result['planned'], 'chunk')} for runs waiting for them."
        return text
