from cleanup.engine import halts, operations
from cleanup.management.base import CleanupCommand, command_actor


class Command(CleanupCommand):
    help = ("Pause a policy: it plans and sends nothing new until cleanup_resume; chunks "
            "already sent finish, runs stay running, scheduled slots join the run in "
            "flight. Pausing a paused policy changes nothing.")

    def add_arguments(self, parser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--policy", required=True, help="The policy to pause.")
        parser.add_argument("--reason", required=True,
                            help="Why, in words: shown by the console, the status and the "
                            "alerts.")

    def run(self, *, policy, reason, **options) -> dict:
        change = operations.pause_policy(policy, reason, actor=command_actor())
        return {**halts.fields(change.halt), "paused": change.changed}

    def describe(self, result: dict, verbosity: int) -> str:
        if result["paused"]:
            return (f"Paused {result['policy']}: nothing new is planned until "
                    f"cleanup_resume --policy {result['policy']}.")
        return (f"{result['policy']} was already {result['described']}; nothing changed.")
