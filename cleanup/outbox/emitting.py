"""Write an event in the caller's transaction: the change and its event commit together,
or neither does."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connections, router

from cleanup.exceptions import CleanupError
from cleanup.models import Event

# A payload says what a handler needs to find the rest; it is not a document store.
MAX_PAYLOAD_BYTES = 8_192

INSERT = """
INSERT INTO cleanup_event (name, "key", ordering_key, payload, state, attempts,
                           available_at, created_at, last_error, cause, reason, source,
                           run_id, chunk_id)
VALUES (%s, %s, %s, %s::jsonb, 'pending', 0, now(), now(), '', '', '', %s, %s, %s)
ON CONFLICT (name, "key") DO NOTHING
RETURNING id
"""


class OutsideTransaction(CleanupError):
    """emit() called in autocommit: the event would commit without the change, or the
    change without it."""


class BadEvent(CleanupError):
    """An event that cannot be stored: an empty name or key, a field too long, a payload
    that is not JSON or too big."""


def emit(name: str, key: str, payload: Any = None, *, ordering_key: str = "",
         source: str | None = None, run_id: UUID | str | None = None,
         chunk_id: int | None = None) -> bool:
    """Record an event in the current transaction; False if ``(name, key)`` exists.

    ``ordering_key`` delivers the events sharing it in the order they were emitted (id
    order): emit while holding the lock of what it names (a section's row), so that id
    order is commit order too. ``source`` defaults to ``run <id> chunk <n>`` when a run
    is given, else ``host``.
    """
    connection = connections[router.db_for_write(Event)]
    if not connection.in_atomic_block:
        raise OutsideTransaction(
            f"emit({name!r}, {key!r}) needs the transaction of the change it reports: call "
            "it inside transaction.atomic(), beside the write")
    if source is None:
        source = "host" if run_id is None else f"run {run_id} chunk {chunk_id}"
    _require(name, "name", Event._meta.get_field("name").max_length)
    _require(key, "key", Event._meta.get_field("key").max_length)
    _require(source, "source", Event._meta.get_field("source").max_length)
    if not isinstance(ordering_key, str) or len(ordering_key) > 255:
        raise BadEvent(f"ordering key must be a string of at most 255 characters, not "
                       f"{ordering_key!r:.60}")
    document = _document(name, {} if payload is None else payload)
    with connection.cursor() as cursor:
        cursor.execute(INSERT, [name, key, ordering_key, document, source,
                                None if run_id is None else str(run_id), chunk_id])
        return cursor.fetchone() is not None


def _require(value: Any, what: str, limit: int) -> None:
    if not isinstance(value, str) or not value.strip():
        raise BadEvent(f"event {what} must be a non-empty string, not {value!r:.60}")
    if len(value) > limit:
        raise BadEvent(f"event {what} is {len(value)} characters long; the limit is {limit}")


def _document(name: str, payload: Any) -> str:
    try:
        document = json.dumps(payload, cls=DjangoJSONEncoder, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise BadEvent(f"payload of {name!r} is not JSON: {exc}") from None
    size = len(document.encode())
    if size > MAX_PAYLOAD_BYTES:
        raise BadEvent(f"payload of {name!r} is {size:,} bytes; the limit is "
                       f"{MAX_PAYLOAD_BYTES:,} (carry ids, not documents)")
    return document
