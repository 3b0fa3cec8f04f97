"""What the cleanup commands share: JSON output and turning domain errors into exits."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from cleanup.exceptions import CleanupError


class CleanupCommand(BaseCommand):
    """A command whose ``run`` returns a JSON-safe result and may raise CleanupError."""

    def add_arguments(self, parser) -> None:
        parser.add_argument("--json", action="store_true", help="Print one JSON object.")

    def handle(self, *args, **options):
        try:
            result = self.run(**options)
        except CleanupError as exc:
            raise CommandError(str(exc)) from exc
        if options["json"]:
            self.stdout.write(json.dumps(result, sort_keys=True))
        else:
            self.stdout.write(self.describe(result, options["verbosity"]))

    def confirm(self, question: str, options: dict) -> None:
        """Ask before a destructive step unless --noinput; anything but 'yes' aborts."""
        if not options.get("interactive", False):
            return
        try:
            answer = input(f"{question} Type 'yes' to go on: ")
        except EOFError:
            answer = ""
        if answer.strip() != "yes":
            raise CommandError("Cancelled; nothing changed.")

    def run(self, **options) -> dict:
        raise NotImplementedError

    def describe(self, result: dict, verbosity: int) -> str:
        raise NotImplementedError
