"""What the cleanup commands share: JSON output, validated numbers and durations, quiet
logs, and one line (or one JSON object) for every refusal."""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import re
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

from django.core.management.base import BaseCommand, CommandError, OutputWrapper
from django.db import OperationalError

from cleanup.cutoffs import parse_cutoff
from cleanup.display import number
from cleanup.exceptions import BadCutoff, CleanupError

# The largest value of a PostgreSQL integer column (chunk ids, counters).
MAX_INTEGER = 2**31 - 1
RUN_HELP = "The run: its full id, or the 8-hex short id the admin shows."


def count(n: int, word: str) -> str:
    """``1 chunk``, ``2 chunks``, ``12,000 chunks``."""
    return f"{number(n)} {word}" + ("" if n == 1 else "s")


def gone_policy_lines(gone: list[dict]) -> list[str]:
    """A result's ``gone_policy_halts`` in words: each policy a deploy removed while it
    was halted, its halts, and the command that ends them (nothing else would)."""
    lines = []
    for policy in gone:
        lines.append(f"{policy['policy']} is no longer registered (removed by a deploy) and "
                     "is still halted:")
        lines += [f"  {halt['described']}" for halt in policy["halts"]]
        lines.append(f"  end it with: {policy['resume_command']}")
    return lines


def _shown(text: str) -> str:
    """The refused text as a refusal quotes it: a pasted megabyte stays one short line."""
    return repr(text if len(text) <= 40 else text[:40] + "...")


class WholeNumber:
    """An argparse type: a whole number within bounds, written in ASCII digits.

    ``int()`` alone takes other scripts' digits and underscores, and a number past the
    bounds reaches PostgreSQL as a DataError (or Python as an OverflowError).
    """

    def __init__(self, minimum: int = 1, maximum: int = MAX_INTEGER):
        self.minimum, self.maximum = minimum, maximum

    def __call__(self, text: str) -> int:
        stripped = text.strip()
        value = int(stripped) if re.fullmatch(r"[0-9]{1,19}", stripped) else None
        if value is None or not self.minimum <= value <= self.maximum:
            raise argparse.ArgumentTypeError(
                f"expected a whole number from {number(self.minimum)} to "
                f"{number(self.maximum)}, not {_shown(text)}")
        return value


UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
DURATION = re.compile(r"([0-9]{1,15}(?:\.[0-9]{1,6})?)([smhd])")


class Duration:
    """An argparse type: a length of time such as ``90s``, ``30m``, ``6h`` or ``2d``,
    positive and at most ``maximum``; ``bare`` is the unit of a number without one
    (None: a unit is required)."""

    def __init__(self, maximum: timedelta, *, bare: str | None = None):
        self.maximum, self.bare = maximum, bare

    @property
    def example(self) -> str:
        bare = f" (a bare number is in {self.bare_word})" if self.bare else ""
        return f"a duration such as 90s, 30m, 6h or 2d{bare}"

    @property
    def bare_word(self) -> str:
        return {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[self.bare]

    def parse(self, text: str) -> timedelta | None:
        """The duration, or None when the text is not written as one."""
        stripped = text.strip()
        if self.bare and re.fullmatch(r"[0-9.]+", stripped):
            stripped += self.bare
        match = DURATION.fullmatch(stripped)
        if match is None:
            return None
        seconds = float(match[1]) * UNITS[match[2]]
        if not 0 < seconds <= self.maximum.total_seconds():
            raise argparse.ArgumentTypeError(
                f"{_shown(text)} is out of range: give more than 0 and at most {self.most}")
        return timedelta(seconds=seconds)

    @property
    def most(self) -> str:
        """The maximum as an operator writes it: ``36,500d``, ``86,400s``."""
        seconds = int(self.maximum.total_seconds())
        return f"{number(seconds // 86400)}d" if seconds % 86400 == 0 else f"{number(seconds)}s"

    def __call__(self, text: str) -> timedelta:
        value = self.parse(text)
        if value is None:
            raise argparse.ArgumentTypeError(f"expected {self.example}, not {_shown(text)}")
        return value


class Since(Duration):
    """An argparse type: an instant, as an ISO-8601 timestamp with offset or as an age
    (``6h``: six hours ago, resolved when the command reads it)."""

    def __call__(self, text: str) -> timedelta | datetime:
        age = self.parse(text)
        if age is not None:
            return age
        try:
            return parse_cutoff(text, "timestamp")
        except BadCutoff as exc:
            # A timestamp that is nearly right says what is wrong with it (no offset).
            why = "" if "is not an ISO-8601" in str(exc) else f" ({exc})"
            raise argparse.ArgumentTypeError(
                f"expected an ISO-8601 timestamp with offset or an age such as 30m, 6h or "
                f"2d (at most {self.most}), not {_shown(text)}{why}") from None


def connection_failure(exc: BaseException) -> str | None:
    """One line saying why connecting to the database failed and what to fix, or None
    when ``exc`` was not raised while connecting (a statement that failed)."""
    wrapper = None
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        # Every Django backend opens its connections in get_new_connection.
        if frame.f_code.co_name == "get_new_connection":
            wrapper = frame.f_locals.get("self")
    if wrapper is None:
        return None
    database = getattr(wrapper, "settings_dict", {})
    host, port = database.get("HOST") or "localhost", database.get("PORT") or "5432"
    user, name = database.get("USER") or "", database.get("NAME") or ""
    # Never the password: the line goes to logs and terminals.
    where = f"postgres://{user + '@' if user else ''}{host}:{port}/{name}"
    # The first line says what failed; psycopg's next ones guess at why, as ``fix`` does.
    reason = " ".join((str(exc).strip().splitlines() or [""])[0].split())
    reason = reason.removeprefix("connection failed: ")
    if "does not exist" in reason and "database" in reason:
        fix = (f"create it (createdb -h {host} -p {port}{' -U ' + user if user else ''} "
               f"{name}) or point DATABASE_URL at one that exists")
    elif "refused" in reason or "timeout expired" in reason:
        fix = (f"nothing accepts connections on {host}:{port}: start PostgreSQL there or fix "
               "the host and port in DATABASE_URL")
    elif "resolve host" in reason or "translate host name" in reason:
        fix = f"no host is called {host!r}: fix the host in DATABASE_URL"
    elif "authentication" in reason or "role" in reason:
        fix = "fix the user or password in DATABASE_URL"
    else:
        fix = "fix DATABASE_URL or start the server it names"
    return f"cannot connect to the database {where}: {reason}; {fix}"


# Room for the name in the halt's actor column (150), beside "command ()".
MAX_OS_USER = 100


def command_actor() -> str:
    """Who paused or resumed from the shell: ``command (alice)``, the OS user running it;
    just ``command`` where none can be told (no login name, no passwd entry)."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError, ImportError):  # which one depends on the Python version
        return "command"
    user = user.strip()
    if not user or len(user) > MAX_OS_USER or not user.isprintable():
        return "command"
    return f"command ({user})"


def ask(question: str, *, who: str, stream: OutputWrapper | None = None) -> None:
    """Ask ``question`` and go on only on 'yes'; anything else, or no terminal to read an
    answer from, raises CommandError with nothing changed.

    ``stream`` takes the prompt instead of stdout (under --json stdout is the result's);
    it is asked there only of a terminal, so a script's stderr holds at most the one
    JSON object of a refusal.
    """
    prompt = f"{question} Type 'yes' to go on: "
    asked = stream is None or sys.stdin.isatty()
    try:
        if stream is None:
            answer = input(prompt)
        else:
            if asked:
                stream.write(prompt, style_func=str, ending="")
                stream.flush()
            answer = input()
    except EOFError:  # stdin is not a terminal, or was closed: nobody to answer
        # End the prompt's line, so the refusal starts a line of its own.
        if stream is None:
            print()
        elif asked:
            stream.write("", style_func=str)
        raise CommandError(f"Cancelled; nothing changed (no answer: {who} needs a terminal "
                           "to confirm, or --noinput).") from None
    if answer.strip() != "yes":
        raise CommandError("Cancelled; nothing changed.")


def _asks_for_json(argv: list[str]) -> bool:
    """Whether a command line asks for --json (argparse also takes a unique prefix)."""
    for arg in argv:
        if arg == "--":
            return False
        if arg.startswith("--j") and "--json".startswith(arg):
            return True
    return False


@contextmanager
def quiet_logs(verbosity: int) -> Iterator[None]:
    """Below ``-v 2``, the log lines under WARNING (the engine's INFO lines, django-q2's
    "Enqueued") are not shown meanwhile: a command prints its own lines."""
    disabled = logging.root.manager.disable
    if verbosity < 2:
        logging.disable(logging.INFO)
    try:
        yield
    finally:
        logging.disable(disabled)


class _HeldErrors(logging.Handler):
    """Stands in for the root logger's handlers while a command runs: passes records
    below ERROR on at once, and keeps the errors for the end."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.replaced: list[logging.Handler] = []

    def install(self) -> None:
        root = logging.getLogger()
        self.replaced, root.handlers = root.handlers[:], [self]

    def uninstall(self, *, replay: bool) -> None:
        logging.getLogger().handlers = self.replaced
        if replay:
            self.replay()
        self.records = []

    def replay(self) -> None:
        """Pass the errors kept so far on, once."""
        for record in self.records:
            self._pass_on(record)
        self.records = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR:
            self.records.append(record)
        else:
            self._pass_on(record)

    def _pass_on(self, record: logging.LogRecord) -> None:
        for handler in self.replaced:
            if record.levelno >= handler.level:
                handler.handle(record)


class CleanupCommand(BaseCommand):
    """A command whose ``run`` returns a JSON-safe result and may raise CleanupError.

    From the shell, every refusal is one line on stderr (``CommandError: ...``), or
    under --json one JSON object ``{"error": "..."}``: what argparse refuses (exit 2),
    what the service refuses and a database that cannot be reached (exit 1). At
    verbosity 1 or less the logs say only warnings and errors; -v 2 shows the INFO lines.
    """

    def add_arguments(self, parser) -> None:
        parser.add_argument("--json", action="store_true", help="Print one JSON object.")

    # Set when run from the shell; called from code (call_command) errors stay exceptions.
    from_shell = False
    json_requested = False
    _held: _HeldErrors | None = None

    def run_from_argv(self, argv):
        self.from_shell = True
        self.json_requested = _asks_for_json(argv[2:])
        return super().run_from_argv(argv)

    def create_parser(self, prog_name, subcommand, **kwargs):
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        if self.from_shell and self.json_requested:
            # argparse reports a bad option through parser.error, before execute() runs:
            # under --json that report is the one JSON object too, without the usage.
            parser.error = self._refuse_arguments
        return parser

    def _refuse_arguments(self, message: str):
        self._write_error(message)
        sys.exit(2)

    def _write_error(self, message: str) -> None:
        self.stderr.write(json.dumps({"error": message}, sort_keys=True), style_func=str)

    def _exit_under_json(self, message: str, options: dict, returncode: int = 1) -> None:
        """Under --json from the shell, end with the error as one JSON object on stderr."""
        if options.get("json") and self.from_shell and not options.get("traceback"):
            self._write_error(message)
            sys.exit(returncode)

    @property
    def command_name(self) -> str:
        return type(self).__module__.rsplit(".", 1)[-1]

    def execute(self, *args, **options):
        quiet = self.from_shell and options.get("verbosity", 1) < 2
        held = self._held = _HeldErrors() if quiet else None
        if quiet:
            # Below -v 2 a command prints its result, not the engine's INFO lines (nor
            # django-q2's "Enqueued"); warnings show as they come, errors at the end.
            held.install()
        failed = True
        try:
            with quiet_logs(options.get("verbosity", 1) if quiet else 2):
                result = super().execute(*args, **options)
            failed = False
            return result
        except OperationalError as exc:
            problem = connection_failure(exc)
            if problem is None:
                raise
            self._exit_under_json(problem, options)
            raise CommandError(problem) from exc
        except CleanupError as exc:
            self._exit_under_json(str(exc), options)
            raise CommandError(str(exc)) from exc
        except CommandError as exc:
            self._exit_under_json(str(exc), options, exc.returncode)
            raise
        finally:
            if quiet:
                # A refusal is one line (or one JSON object) that says it all: the error
                # lines that led to it would only say it again, before it.
                held.uninstall(replay=not failed)

    def handle(self, *args, **options):
        result = self.run(**options)
        if self._held is not None:
            # The result has the last word: errors met on the way (a --sync process
            # that was taken over) come before it, not after.
            self._held.replay()
        if options["json"]:
            self.stdout.write(json.dumps(result, sort_keys=True))
        else:
            self.stdout.write(self.describe(result, options["verbosity"]))

    def confirm(self, question: str, options: dict) -> None:
        """Ask before a destructive step unless --noinput; anything but 'yes' aborts."""
        if not options.get("interactive", False):
            return
        ask(question, who=self.command_name, stream=self.stderr if options.get("json") else None)

    def run(self, **options) -> dict:
        raise NotImplementedError

    def describe(self, result: dict, verbosity: int) -> str:
        raise NotImplementedError
