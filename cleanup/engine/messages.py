"""The queue message for one chunk: build it, and parse what a worker receives.

Version 4 is current: a range chunk names its partition ``partition`` (a tenant, a
run, a policy: whatever the policy partitions by), or none for a range over the whole
table. Version 3, the previous one, called it ``tenant_id`` whatever it held. A worker
reads the version it writes and the one before, as old and new workers overlap during a
deploy; an older message is dead-lettered at once, saying which release last wrote it.

Every timestamp is read as an instant in UTC. An observed value is ISO-8601, or
PostgreSQL's own text for a value Python cannot hold (``-infinity``, ``infinity``, a
BC or post-9999 instant), or null where the column allows it.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cleanup.cutoffs import in_utc
from cleanup.exceptions import BadCutoff, MalformedMessage

CURRENT_VERSION = 4
SUPPORTED_VERSIONS = (3, 4)
# What ObservedText writes for values outside Python's years: PostgreSQL's output in UTC.
POSTGRES_ONLY_TIMESTAMP = re.compile(
    r"-?infinity|\d{4,6}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d{1,6})?\+00( BC)?"
)


# What ObservedText writes for every other value: ISO-8601 in UTC, with microseconds.
AS_PLANNED = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\+00:00")


@dataclass(frozen=True)
class ChunkMessage:
    version: int
    run_id: str
    chunk_id: int
    policy: str
    cutoff: datetime
    parameters: dict[str, datetime]  # derived instants by name
    items: list[tuple[Any, datetime | str | None]] | None = None
    partition: Any = None
    whole_table: bool = False  # a range over the whole table: no partition
    start_id: int | None = None
    end_id: int | None = None

    @property
    def scheme(self) -> str:
        return "items" if self.items is not None else "range"


# The largest chunk id the ledger's column holds (PostgreSQL's integer).
MAX_CHUNK_ID = 2**31 - 1


def header(run, chunk_id: int) -> dict:
    """Return what every message of a run's chunk starts with."""
    return {
        "version": CURRENT_VERSION,
        "run_id": str(run.id),
        "chunk_id": chunk_id,
        "policy": run.policy,
        "cutoff": run.cutoff.isoformat(),
        "parameters": dict(run.parameters),
    }


def items_message(run, chunk_id: int, items) -> dict:
    """Return the JSON-safe message of an items chunk: [pk, observed value] pairs."""
    return {
        **header(run, chunk_id),
        # Written out for the common case (int pk, text from planning): a million items
        # go through this line when a backlog is planned.
        "items": [
            [pk if type(pk) is int else _json_key(pk),
             observed if type(observed) is str or observed is None else observed.isoformat()]
            for pk, observed in items
        ],
    }


def range_message(run, chunk_id: int, partition, start_id: int, end_id: int, *,
                  partitioned: bool = True) -> dict:
    """Return the JSON-safe message of a range chunk: half-open [start_id, end_id), in
    one partition (``partition``) or, without one, over the whole table."""
    return {
        **header(run, chunk_id),
        **({"partition": _json_key(partition)} if partitioned else {}),
        "start_id": start_id,
        "end_id": end_id,
    }


def _json_key(value: Any) -> Any:
    """Keys that JSON cannot carry as they are (UUIDs) travel as strings."""
    return value if isinstance(value, (int, str)) or value is None else str(value)


def identify(raw: Any) -> tuple[str | None, int | None]:
    """Best-effort run and chunk ids of a message, even a malformed one."""
    data = as_dict(raw)
    if data is None:
        return None, None
    run_id = data.get("run_id")
    chunk_id = data.get("chunk_id")
    try:
        run_id = str(uuid.UUID(str(run_id)))
    except ValueError:
        run_id = None
    if type(chunk_id) is not int or not 1 <= chunk_id <= MAX_CHUNK_ID:
        chunk_id = None  # not one a chunk can have: its column is a positive integer
    return run_id, chunk_id


def parse(raw: Any) -> ChunkMessage:
    """Validate a received message; raise MalformedMessage saying what is wrong."""
    run_id, chunk_id = identify(raw)

    def bad(reason: str) -> MalformedMessage:
        return MalformedMessage(reason, run_id=run_id, chunk_id=chunk_id)

    data = as_dict(raw)
    if data is None:
        raise bad("message is not a JSON object")
    version = data.get("version")
    if type(version) is int and 0 < version < SUPPORTED_VERSIONS[0]:
        # One text for every run: it is the cause dead letters are grouped by.
        raise bad(f"message version {version} is no longer read (supported: "
                  f"{SUPPORTED_VERSIONS}); versions before 3 were last written by "
                  "seat-hold-cleanup 0.1.0 until commit 83a6297 (2026-12-01): replay the run "
                  "with a new cutoff (cleanup_replay RUN_ID --new-cutoff CUTOFF)")
    if type(version) is not int or version not in SUPPORTED_VERSIONS:
        raise bad(f"unknown message version {version!r} (supported: {SUPPORTED_VERSIONS})")
    if run_id is None:
        raise bad("run_id is missing or not a UUID")
    if chunk_id is None:
        raise bad(f"chunk_id is missing or not an integer from 1 to {MAX_CHUNK_ID}")
    policy = data.get("policy")
    if not isinstance(policy, str) or not policy:
        raise bad("policy is missing")
    cutoff = _aware_datetime(data.get("cutoff"), "cutoff", bad)
    given = data.get("parameters")
    if not isinstance(given, dict) or not all(isinstance(k, str) for k in given):
        raise bad("parameters must be an object of named timestamps")
    parameters = {name: _aware_datetime(value, f"parameter {name}", bad)
                  for name, value in given.items()}
    fields = {"version": version, "run_id": run_id, "chunk_id": chunk_id,
              "policy": policy, "cutoff": cutoff, "parameters": parameters}
    if "items" in data:
        items = data["items"]
        if not isinstance(items, list) or not items:
            raise bad("items must be a non-empty list")
        pairs = []
        for item in items:
            if not isinstance(item, list) or len(item) != 2:
                raise bad("each item must be a [pk, observed value] pair")
            pairs.append((item[0], _observed(item[1], bad)))
        return ChunkMessage(**fields, items=pairs)
    partition_key = "partition" if version >= 4 else "tenant_id"
    if {"start_id", "end_id"} <= data.keys():
        start_id, end_id = data["start_id"], data["end_id"]
        if not all(type(v) is int for v in (start_id, end_id)):
            raise bad("start_id and end_id must be integers")
        if start_id >= end_id:
            raise bad(f"empty range [{start_id}, {end_id})")
        return ChunkMessage(**fields, partition=data.get(partition_key),
                            whole_table=partition_key not in data,
                            start_id=start_id, end_id=end_id)
    raise bad("message has neither items nor a start_id/end_id range")


def same_work(raw: Any, received: ChunkMessage, ledger_copy: dict) -> bool:
    """Whether a received message covers what its chunk's copy in the ledger does, the
    authority on what a chunk covers.

    A message as sent equals its copy; only one that differs (the previous version, a
    forged one) is parsed again to compare what it covers.
    """
    if as_dict(raw) == ledger_copy:
        return True
    try:
        planned = parse(ledger_copy)
    except MalformedMessage:
        return False  # a copy in a version no longer read: nothing to compare it with
    covered = ("items", "whole_table", "partition", "start_id", "end_id")
    return [getattr(received, name) for name in covered] == [
        getattr(planned, name) for name in covered
    ]


def as_dict(raw: Any) -> dict | None:
    """Return a message (a dict, or its JSON text) as a dict, or None if it is neither."""
    if isinstance(raw, (str, bytes)):
        try:
            raw = json.loads(raw)
        except ValueError:
            return None
    return raw if isinstance(raw, dict) else None


def _aware_datetime(value: Any, what: str, bad) -> datetime:
    try:
        parsed = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise bad(f"{what} {value!r} is not an ISO-8601 timestamp") from None
    try:
        return in_utc(parsed, what)
    except BadCutoff as exc:
        raise bad(str(exc)) from None


def _observed(value: Any, bad) -> datetime | str | None:
    """An observed value: an instant, PostgreSQL's text for one Python cannot hold, or
    null; the DELETE compares the row with it as PostgreSQL reads it.

    Text exactly as planning writes it (UTC, microseconds) is kept as text once it
    parses: a chunk carries thousands, and each would otherwise be parsed, checked and
    formatted again for the DELETE's array parameter.
    """
    if value is None:
        return None
    if isinstance(value, str):
        if AS_PLANNED.fullmatch(value):
            try:
                datetime.fromisoformat(value)
            except ValueError:
                raise bad(f"observed value {value!r} is not an ISO-8601 timestamp") from None
            return value
        if POSTGRES_ONLY_TIMESTAMP.fullmatch(value):
            return value
    return _aware_datetime(value, "observed value", bad)
