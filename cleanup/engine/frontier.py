"""A run's frontier: where its next chunk starts, in one of four shapes.

- ranges over the whole table: ``NextId`` (``{"next_id": n}``);
- ranges per partition: ``PartitionNextId`` (``{"partition": p, "next_id": n}``), in
  (partition, pk) order (``partition`` null before the first one);
- items: ``AfterItem`` (``{"after": [observed text, pk]}``) in (observed value, pk)
  order (null before the first row), then ``AfterNull`` (``{"nulls_after": pk}``) for
  rows whose observed value is NULL.

The run stores it as JSON; ``load`` is the one place that reads it back, and refuses a
shape the engine never writes (a row changed by hand) with ``BadFrontier``, so one bad
run is reported as what it is and never takes a page or a listing down.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cleanup.exceptions import CleanupError


class BadFrontier(CleanupError):
    def __init__(self, stored: object):
        super().__init__(f"the run's frontier {stored!r} is not one the engine writes")


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _key(value: Any) -> bool:
    """A primary key or partition as JSON holds it: an integer or a text."""
    return isinstance(value, str) or _whole(value)


def json_safe(value: Any) -> Any:
    """A key as the frontier stores it: integers and texts as they are, others as text."""
    return value if value is None or _key(value) else str(value)


@dataclass(frozen=True)
class NextId:
    next_id: int

    def to_json(self) -> dict:
        return {"next_id": self.next_id}

    def offset(self, run) -> float | None:
        return self.next_id


@dataclass(frozen=True)
class PartitionNextId:
    partition: Any
    next_id: int

    def to_json(self) -> dict:
        return {"partition": self.partition, "next_id": self.next_id}

    def offset(self, run) -> float | None:
        return None  # (partition, pk) order has no one axis to measure along


@dataclass(frozen=True)
class AfterItem:
    """After the item (observed value as text, pk); ``None`` before the first row."""

    after: tuple[str, Any] | None

    def to_json(self) -> dict:
        return {"after": None if self.after is None else list(self.after)}

    def offset(self, run) -> float | None:
        if self.after is None:
            return run.span_start
        try:
            return int(datetime.fromisoformat(self.after[0]).timestamp())
        except ValueError:  # PostgreSQL's own text, such as -infinity
            return None


@dataclass(frozen=True)
class AfterNull:
    """Among the rows whose observed value is NULL, after this pk (None: from the first)."""

    nulls_after: Any

    def to_json(self) -> dict:
        return {"nulls_after": self.nulls_after}

    def offset(self, run) -> float | None:
        return None


Frontier = NextId | PartitionNextId | AfterItem | AfterNull


def load(stored: object) -> Frontier | None:
    """The frontier a run stored (None once every chunk is planned); BadFrontier for
    anything else."""
    if stored is None:
        return None
    if isinstance(stored, dict):
        keys = set(stored)
        if keys == {"next_id"} and _whole(stored["next_id"]):
            return NextId(stored["next_id"])
        if (keys == {"partition", "next_id"} and _whole(stored["next_id"])
                and (stored["partition"] is None or _key(stored["partition"]))):
            return PartitionNextId(stored["partition"], stored["next_id"])
        if keys == {"after"}:
            after = stored["after"]
            if after is None:
                return AfterItem(None)
            if (isinstance(after, list) and len(after) == 2 and isinstance(after[0], str)
                    and _key(after[1])):
                return AfterItem((after[0], after[1]))
        if keys == {"nulls_after"} and (stored["nulls_after"] is None
                                        or _key(stored["nulls_after"])):
            return AfterNull(stored["nulls_after"])
    raise BadFrontier(stored)


def dump(frontier: Frontier | None) -> dict | None:
    return None if frontier is None else frontier.to_json()


def position(run) -> float | None:
    """How far the run's frontier is through its span, from 0 to 1; None where the span
    has no order to measure (ranges per partition, the NULLs after the items, infinite
    values) or the stored frontier cannot be read."""
    if run.planned_all:
        return 1.0
    if run.span_start is None or run.span_end is None:
        return None
    try:
        frontier = load(run.frontier)
    except BadFrontier:
        return None
    at = None if frontier is None else frontier.offset(run)
    width = run.span_end - run.span_start
    if at is None or width <= 0:
        return None
    return min(max((at - run.span_start) / width, 0.0), 1.0)


def problem(run) -> str:
    """Why the run's stored frontier cannot be read, or empty."""
    try:
        load(run.frontier)
    except BadFrontier as exc:
        return str(exc)
    return ""
