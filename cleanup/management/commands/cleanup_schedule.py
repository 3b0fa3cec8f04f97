from dataclasses import asdict

from cleanup.management.base import CleanupCommand
from cleanup.scheduling.schedules import install_schedules


class Command(CleanupCommand):
    help = "Install or update the django-q2 schedules of the registered policies."

    def run(self, **options) -> dict:
        return asdict(install_schedules())

    def describe(self, result: dict, verbosity: int) -> str:
        return "; ".join(
            f"{what}: {', '.join(names) if names else 'none'}" for what, names in result.items()
        )
