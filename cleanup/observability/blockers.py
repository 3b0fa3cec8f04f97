"""The sessions that keep a policy's chunks waiting, read from PostgreSQL when asked.

(Being built: item 3 of issue 33.)
"""

from __future__ import annotations


def for_chunk(chunk):
    """The sessions blocking this chunk now, or None if it waits on nothing."""
    return None


def for_run(run):
    """The sessions blocking this run's unfinished chunks now, or None."""
    return None


def for_policy(policy: str):
    """The sessions blocking this policy's unfinished chunks now, or None."""
    return None
