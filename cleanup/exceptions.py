"""Errors the cleanup engine raises from its services."""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass


class CleanupError(Exception):
    """Base of every error the engine raises on purpose."""


class UnknownPolicy(CleanupError):
    def __init__(self, name: str, known: list[str]):
        super().__init__(f"unknown policy {name!r} (known: {', '.join(known) or 'none'})")


class BadCutoff(CleanupError):
    """A cutoff that is unparsable, naive, in the future or before the one it replays."""


class BadScheme(CleanupError):
    pass


class BadKey(CleanupError):
    """A dispatch key that is empty or too long for the ledger."""


class KeyReused(CleanupError):
    """A dispatch key already names a run of another request."""


class UnknownTask(CleanupError):
    def __init__(self, name: str, known: list[str]):
        super().__init__(f"no host task {name!r} is registered (known: "
                         f"{', '.join(known) or 'none'})")


class UnknownRun(CleanupError):
    def __init__(self, run_id: object):
        super().__init__(f"no run with id {run_id}")


class UnknownChunk(CleanupError):
    def __init__(self, run_id: object, chunk_ids: list[int]):
        ids = ", ".join(str(c) for c in chunk_ids)
        super().__init__(f"run {run_id} has no chunk {ids}")


class MalformedMessage(CleanupError):
    """A queue message that cannot be acted on; it is dead-lettered, never retried."""

    def __init__(self, reason: str, run_id: str | None = None, chunk_id: int | None = None):
        super().__init__(reason)
        self.reason = reason
        self.run_id = run_id
        self.chunk_id = chunk_id


CAUSE_LENGTH = 255


def summary_of(exc: BaseException) -> str:
    """An exception in one line, as a run keeps why planning failed."""
    return f"{type(exc).__name__}: {exc}"[:2000]


def traceback_of(exc: BaseException) -> str:
    """An exception with its traceback, as a chunk keeps its last error."""
    return "".join(traceback.format_exception(exc)).strip()


# What makes one failure's text differ from the next one's alike: a value quoted in it,
# a UUID, a number (a row's id, a pid, a byte count).
_VALUES = re.compile(r"""'[^']*'|"[^"]*"|\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}"""
                     r"""-[0-9a-f]{12}\b|\b\d[\d.,:]*\b""", re.IGNORECASE)


def cause_key(error: str) -> str:
    """The cause failures alike are grouped by (``cause_of``, its quoted values, UUIDs and
    numbers each one "…"): a trigger whose message names the row it refused is one cause
    for every row, and an alert's label takes few values. The whole message is kept
    beside it (a chunk's last error)."""
    return _VALUES.sub("…", cause_of(error))


def cause_of(error: str) -> str:
    """The line of an error text an operator reads first: the exception itself.

    For a traceback that is the first line after its last frame, without the module
    path (``OperationalError: canceling statement due to lock timeout``), not the
    ``CONTEXT:`` or ``DETAIL:`` lines PostgreSQL adds after it; for a plain reason,
    its first line.
    """
    lines = [line for line in error.strip().splitlines() if line.strip()]
    start = max((i for i, line in enumerate(lines) if line.startswith("Traceback (")),
                default=None)
    if start is not None:
        after = [line for line in lines[start + 1:] if not line[:1].isspace()]
        lines = after or lines
    if not lines:
        return ""
    first = lines[0].strip()
    name, sep, message = first.partition(": ")
    if sep and " " not in name and "." in name:
        first = f"{name.rsplit('.', 1)[1]}: {message}"
    return first[:CAUSE_LENGTH]


# An operator's reason (a pause's, an event's discard) is shown whole, on one line, by
# the console, cleanup_status and the alerts.
MAX_REASON = 500


def operator_reason(reason: object, whose: str, *, missing: str) -> str:
    """The reason, stripped; ``CleanupError`` (``missing`` if it is empty) unless it is
    one line of at most MAX_REASON printable characters. ``whose``: "a pause's"."""
    if reason is not None and not isinstance(reason, str):
        raise CleanupError(f"{whose} reason must be text, not {type(reason).__name__}")
    reason = (reason or "").strip()
    if not reason:
        raise CleanupError(missing)
    if len(reason) > MAX_REASON:
        raise CleanupError(f"{whose} reason is at most {MAX_REASON} characters (this one has "
                           f"{len(reason):,}): the console, the status and the alerts show "
                           "it whole")
    # Not printable: a newline, a NUL (PostgreSQL's text refuses it), a lone surrogate.
    if unprintable := next((c for c in reason if not c.isprintable()), None):
        raise CleanupError(f"{whose} reason must be one line of printable text; it holds "
                           f"{unprintable!r}")
    return reason


@dataclass(frozen=True)
class ActionResult:
    """What an operator's action on chunks, runs or events did: how many rows it changed,
    how many it left alone (not in a state it applies to), and the pks of those changed."""

    done: int
    skipped: int
    affected: tuple = ()
