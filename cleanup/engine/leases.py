"""Leases: claims on work that lapse on the database's clock unless renewed.

A lease is a row (cleanup.models.Lease), never a session lock: behind a transaction
pooler (PgBouncer) a server connection outlives its client, so a session-level
advisory lock taken by a process that died, froze or lost its network would stay
held for as long as the pooler keeps that connection. A row lapses by itself; whoever
finds it lapsed takes the work over with a guarded statement, and an owner that wakes
up late finds the row gone or someone else's and stops.

Every statement here is one round trip and reads ``clock_timestamp()``, so hosts
whose clocks differ agree on who holds what.

A renewal sets a lease's expiry its length ahead of the database's clock, so a live
lease's expiry is never further off than that from now: one further off (an operator's
edit: ``infinity``, a year ahead) is no renewal's, and the lease reads as lapsed. The
row keeps no time of its last renewal, so whoever reads an expiry passes the lease's
length (its setting) to bound it by.
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

# Whether a lease's row (named ``lease``) is held: unexpired, and no further off than
# the lease's length (the statement's parameter) from now.
_HELD = ("lease.expires_at BETWEEN clock_timestamp() "
         "AND clock_timestamp() + make_interval(secs => %s)")

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
            f"WHERE lease.owner = EXCLUDED.owner OR NOT ({_HELD}) "
            "RETURNING 1",
            [name, owner, seconds, seconds],
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


def live(names: Iterable[str], seconds: float) -> set[str]:
    """The leases among ``names`` (each of ``seconds``) that someone holds unexpired."""
    names = list(names)
    if not names:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(
            f'SELECT name FROM "{_TABLE}" AS lease WHERE name = ANY(%s) AND {_HELD}',
            [names, seconds],
        )
        return {name for (name,) in cursor.fetchall()}
