"""Errors the cleanup engine raises from its services."""

from __future__ import annotations


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
