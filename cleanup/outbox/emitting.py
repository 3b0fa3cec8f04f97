"""Write an event in the caller's transaction: the change and its event commit together,
or neither does."""

from __future__ import annotations

import json
import re
from typing import Any
from uuid import UUID

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connections, router

from cleanup.conf import conf
from cleanup.exceptions import CleanupError
from cleanup.models import Event
from cleanup.outbox import events

# The range of the integer column chunk_id.
PG_INTEGER = range(-2_147_483_648, 2_147_483_648)
# A NUL escaped in JSON text (not an escaped backslash followed by "u0000"): PostgreSQL's
# jsonb refuses it, as its text refuses the NUL itself.
ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


class OutsideTransaction(CleanupError):
    """emit() called in autocommit: the event would commit without the change, or the
    change without it."""


class BadEvent(CleanupError):
    """An event that cannot be stored: an empty name or key, a field too long or holding
    what PostgreSQL refuses (a NUL, a lone surrogate), a payload that is not JSON, too
    big or too deep, a run id that is no UUID, a chunk id out of its column's range."""


def emit(name: str, key: str, payload: Any = None, *, ordering_key: str = "",
         source: str | None = None, run_id: UUID | str | None = None,
         chunk_id: int | None = None) -> bool:
    """Record an event in the current transaction; False if ``(name, key)`` exists.

    ``ordering_key`` delivers the events sharing it in the order they were emitted (id
    order): emit while holding the lock of what it names (a section's row), so that id
    order is commit order too. ``source`` defaults to ``run <id> chunk <n>`` when a run
    is given, else ``host``. Every value is checked before any SQL (``BadEvent``), so a
    refused event leaves the caller's transaction as it was.
    """
    if not connections[router.db_for_write(Event)].in_atomic_block:
        raise OutsideTransaction(
            f"emit({name!r}, {key!r}) needs the transaction of the change it reports: call "
            "it inside transaction.atomic(), beside the write")
    event_name(name)
    _require(key, "key", Event._meta.get_field("key").max_length)
    if not isinstance(ordering_key, str) or len(ordering_key) > 255:
        raise BadEvent(f"ordering key must be a string of at most 255 characters, not "
                       f"{ordering_key!r:.60}")
    _storable(ordering_key, "ordering key")
    run_id = _run_id(run_id)
    _chunk_id(chunk_id)
    if source is None:
        source = "host" if run_id is None else f"run {run_id} chunk {chunk_id}"
    _require(source, "source", Event._meta.get_field("source").max_length)
    document = _document(name, {} if payload is None else payload)
    return events.insert(name, key, ordering_key, document, source, run_id, chunk_id)


def event_name(name: Any) -> str:
    """The name, if an event may be called that (emit's rule, and a trigger's)."""
    _require(name, "name", Event._meta.get_field("name").max_length)
    return name


def _require(value: Any, what: str, limit: int) -> None:
    if not isinstance(value, str) or not value.strip():
        raise BadEvent(f"event {what} must be a non-empty string, not {value!r:.60}")
    if len(value) > limit:
        raise BadEvent(f"event {what} is {len(value)} characters long; the limit is {limit}")
    _storable(value, what)


def _storable(text: str, what: str) -> None:
    """Refuse the text PostgreSQL would refuse mid-transaction, aborting the caller's."""
    if "\x00" in text:
        raise BadEvent(f"event {what} holds a NUL character, which PostgreSQL cannot store: "
                       f"{text!r:.60}")
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise BadEvent(f"event {what} holds a lone surrogate "
                       f"{exc.object[exc.start:exc.end]!r}, which is not UTF-8: "
                       f"{text!r:.60}") from None


def _run_id(run_id: Any) -> str | None:
    if run_id is None or isinstance(run_id, UUID):
        return None if run_id is None else str(run_id)
    try:
        return str(UUID(run_id))
    except (TypeError, ValueError, AttributeError):
        raise BadEvent(f"event run id must be a UUID, not {run_id!r:.60}") from None


def _chunk_id(chunk_id: Any) -> None:
    if chunk_id is None:
        return
    if not isinstance(chunk_id, int) or isinstance(chunk_id, bool) or chunk_id not in PG_INTEGER:
        raise BadEvent(f"event chunk id must be a whole number from {PG_INTEGER.start} to "
                       f"{PG_INTEGER.stop - 1}, not {chunk_id!r:.60}")


def _document(name: str, payload: Any) -> str:
    """The payload as JSON text, within CLEANUP_EVENT_PAYLOAD_MAX_BYTES and _MAX_DEPTH."""
    limit = conf.EVENT_PAYLOAD_MAX_BYTES
    _bounded(name, payload, limit, conf.EVENT_PAYLOAD_MAX_DEPTH)
    try:
        document = json.dumps(payload, cls=DjangoJSONEncoder, sort_keys=True,
                              allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise BadEvent(f"payload of {name!r} is not JSON: {exc}") from None
    _storable(document, f"payload of {name!r}")
    if ESCAPED_NUL.search(document):
        raise BadEvent(f"event payload of {name!r} holds a NUL character (\\u0000), which "
                       "PostgreSQL's jsonb cannot store")
    size = len(document.encode())
    if size > limit:
        raise BadEvent(f"payload of {name!r} is {size:,} bytes; the limit is {limit:,} "
                       "(CLEANUP_EVENT_PAYLOAD_MAX_BYTES: carry ids, not documents)")
    return document


def _bounded(name: str, payload: Any, limit: int, max_depth: int) -> None:
    """Refuse a payload nested deeper than ``max_depth``, or holding more values than
    ``limit`` bytes of JSON can, walking it without recursion: serialising it first
    would blow the stack (or go round a cycle) on what this refuses."""
    pending, values = [(payload, 1)], 1
    while pending:
        value, depth = pending.pop()
        if not isinstance(value, dict | list | tuple):
            continue
        if depth > max_depth:
            raise BadEvent(f"payload of {name!r} is nested more than {max_depth} deep "
                           "(CLEANUP_EVENT_PAYLOAD_MAX_DEPTH)")
        values += len(value)
        if values > limit:  # each value takes at least one byte of JSON
            raise BadEvent(f"payload of {name!r} holds more than {limit:,} values, so more "
                           f"than {limit:,} bytes (CLEANUP_EVENT_PAYLOAD_MAX_BYTES: carry "
                           "ids, not documents)")
        children = value.values() if isinstance(value, dict) else value
        pending.extend((child, depth + 1) for child in children)
