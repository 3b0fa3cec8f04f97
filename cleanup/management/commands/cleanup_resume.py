from cleanup.engine import halts, operations
from cleanup.management.base import CleanupCommand, command_actor, count


class Command(CleanupCommand):
    help = ("Resume a paused policy, or one halted for failing: the halt ends and its window "
            "is topped up at once. Resuming a policy that is not halted so changes nothing.")

    def add_arguments(self, parser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--policy", required=True, help="The policy to resume.")

    def run(self, *, policy, **options) -> dict:
        change = operations.resume_policy(policy, actor=command_actor())
        return {**halts.fields(change.halt), "resumed": change.changed,
                "chunks_planned": change.planned}

    def describe(self, result: dict, verbosity: int) -> str:
        if result["resumed"]:
            return (f"Resumed {result['policy']} after it was {result['described']}; "
                    f"{count(result['chunks_planned'], 'chunk')} planned now.")
        return (f"{result['policy']} is not paused (its last pause ended "
                f"{result['ended_at']}); nothing changed.")
