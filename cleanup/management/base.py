"""What the cleanup commands share: JSON output and turning domain errors into exits."""

from __future__ import annotations

import json
import sys

from django.core.management.base import BaseCommand, CommandError

from cleanup.exceptions import CleanupError


def count(n: int, word: str) -> str:
    """``1 chunk``, ``2 chunks``."""
    return f"{n} {word}" + ("" if n == 1 else "s")


class CleanupCommand(BaseCommand):
    """A command whose ``run`` returns a JSON-safe result and may raise CleanupError."""

    def add_arguments(self, parser) -> None:
        parser.add_argument("--json", action="store_true", help="Print one JSON object.")

    # Set when run from the shell; called from code (call_command) errors stay exceptions.
    from_shell = False

    def run_from_argv(self, argv):
        self.from_shell = True
        return super().run_from_argv(argv)

    def handle(self, *args, **options):
        try:
            result = self.run(**options)
        except (CleanupError, CommandError) as exc:
            if options["json"] and self.from_shell:
                # Under --json an error is a JSON object too, on stderr, with exit 1.
                self.stderr.write(json.dumps({"error": str(exc)}, sort_keys=True))
                sys.exit(1)
            if isinstance(exc, CommandError):
                raise
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
