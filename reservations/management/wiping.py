"""What the commands that start from empty reservation tables share."""

from __future__ import annotations

import signal
import sys

from cleanup.host import ask


def confirm_wipe(command: str, interactive: bool) -> None:
    """Ask before deleting all reservation data unless --noinput; anything but 'yes'
    aborts with nothing changed."""
    if not interactive:
        return
    # The same prompt as every cleanup command's, and the same refusals.
    ask(f"{command} deletes all reservation data first.", who=command)


def exit_on_sigterm(command: str) -> None:
    """Turn SIGTERM into SystemExit, so the command's finally blocks stop its qclusters."""
    signal.signal(signal.SIGTERM, lambda *args: sys.exit(f"{command} stopped by SIGTERM"))


def add_wipe_arguments(parser, *, json_help: str = "Print one JSON object.") -> None:
    """--noinput and --json, as every command that wipes the reservation data takes them."""
    parser.add_argument("--noinput", "--no-input", action="store_false", dest="interactive",
                        help="Do not ask before deleting the reservation data.")
    parser.add_argument("--json", action="store_true", help=json_help)
