"""How the commands that run a whole cycle (the demo, the soak) report it: progress
lines while it runs, then the report as a table or as one JSON object."""

from __future__ import annotations

import json
from collections.abc import Callable

from django.core.management.base import BaseCommand, CommandError


def progress(command: BaseCommand, options: dict) -> Callable[[str], None]:
    """Where progress lines go: the command's output, or nowhere under --json."""
    return (lambda line: None) if options["json"] else command.stdout.write


def write_report(command: BaseCommand, report, options: dict, *, table: Callable,
                 failed: str) -> None:
    """The report as one JSON object (its fields and ``ok``) under --json, else as
    ``table(report)``; then CommandError(``failed``) if one of its checks failed."""
    if options["json"]:
        command.stdout.write(json.dumps(report.__dict__ | {"ok": report.ok}, default=str))
    else:
        command.stdout.write(table(report))
    if not report.ok:
        raise CommandError(failed)
