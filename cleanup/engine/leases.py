"""Leases: claims on work that lapse on the database's clock unless renewed.

A lease is a row (cleanup.models.Lease), never a session lock: behind a transaction
pooler (PgBouncer) a server connection outlives its client, so a session-level
advisory lock taken by a process that died, froze or lost its network would stay
held for as long as the pooler keeps that connection. A row lapses by itself; whoever
finds it lapsed takes the work over with a guarded statement, and an owner that wakes
up late finds the row gone or someone else's and stops.

Every statement here is one round trip and reads ``clock_timestamp()``, so hosts
whose clocks differ agree on who holds what.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterable

from django.db import connection

from cleanup.conf import conf
from cleanup.models import Lease

_TABLE = Lease._meta.db_table

# The owner token of this process: hosts and pids repeat, the random part does not.
# Kept per pid, so a forked child never passes for its parent.
_owner: tuple[int, str] | None = None


def this_process() -> str:
    """The owner name of this process: host (``CLEANUP_NODE_NAME`` if set), pid and a
    random token. A chunk's history names the worker of each delivery by it too."""
    global _owner
    if _owner is None or _owner[0] != os.getpid():
        host = conf.NODE_NAME or socket.gethostname()
        _owner = (os.getpid(), f"{host}:{os.getpid()}:{uuid.uuid4().hex[:8]}")
    return _owner[1]


def take(name: str, owner: str, seconds: float) -> bool:
    """Take the lease unless another owner holds it unexpired; True if ``owner`` now
    holds it for ``seconds`` (taking it again extends it)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f'INSERT INTO "{_TABLE}" AS lease (name, owner, taken_at, expires_at) '
            "VALUES (%s, %s, clock_timestamp(), clock_timestamp() + make_interval(secs => %s)) "
            "ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, "
            "taken_at = CASE WHEN lease.owner = EXCLUDED.owner THEN lease.taken_at "
            "ELSE EXCLUDED.taken_at END, expires_at = EXCLUDED.expires_at "
            "WHERE lease.owner = EXCLUDED.owner OR lease.expires_at < clock_timestamp() "
            "RETURNING 1",
            [name, owner, seconds],
        )
        return cursor.fetchone() is not None


def renew(name: str, owner: str, seconds: float) -> bool:
    """Extend the lease ``owner`` holds by ``seconds`` from now; False if it is no
    longer its own (taken over: the row is gone or another's).

    Inside a transaction it also keeps a takeover waiting until that transaction ends.
    A lease that lapsed but that nobody took over is still the owner's to renew.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            f'UPDATE "{_TABLE}" SET expires_at = clock_timestamp() + make_interval(secs => %s) '
            "WHERE name = %s AND owner = %s RETURNING 1",
            [seconds, name, owner],
        )
        return cursor.fetchone() is not None


def release(name: str, owner: str) -> None:
    """Give the lease up, if ``owner`` still holds it."""
    with connection.cursor() as cursor:
        cursor.execute(f'DELETE FROM "{_TABLE}" WHERE name = %s AND owner = %s', [name, owner])


def live(names: Iterable[str]) -> set[str]:
    """The leases among ``names`` that someone holds unexpired."""
    names = list(names)
    if not names:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(
            f'SELECT name FROM "{_TABLE}" WHERE name = ANY(%s) '
            "AND expires_at >= clock_timestamp()",
            [names],
        )
        return {name for (name,) in cursor.fetchall()}


def end_lapsed(name: str) -> bool:
    """End the lease if it lapsed (or nobody holds it), in the caller's transaction;
    True if the work is free to take over.

    The row is locked first, so an owner renewing at that moment either renewed before
    (and the lease is live: False) or finds the row gone once this transaction commits.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            f'SELECT expires_at >= clock_timestamp() FROM "{_TABLE}" WHERE name = %s '
            "FOR UPDATE",
            [name],
        )
        row = cursor.fetchone()
        if row is not None and row[0]:
            return False
        cursor.execute(f'DELETE FROM "{_TABLE}" WHERE name = %s', [name])
        return True
