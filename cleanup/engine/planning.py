"""Plan a run's chunks as it goes: its key span at dispatch, then one chunk at a time
from its frontier.

A frontier is where the next chunk starts (cleanup.engine.frontier: one of four shapes, stored
on the run as JSON).

Each step reads only what the next chunk holds, through the index the policy should
have on its eligible rows, so memory stays flat and a stretch where nothing is eligible
is crossed by one index probe, not walked.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import (
    BigIntegerField,
    Count,
    DateTimeField,
    Max,
    Min,
    Q,
    Subquery,
    Value,
)
from django.db.models.functions import Cast

from cleanup.engine.frontier import (
    AfterItem,
    AfterNull,
    Frontier,
    NextId,
    PartitionNextId,
    json_safe,
)
from cleanup.engine.frontier import position as frontier_position
from cleanup.expressions import Clamped, ObservedText
from cleanup.policies import ITEMS, Policy


@dataclass(frozen=True)
class PlannedChunk:
    rows: int  # eligible rows counted at planning, or estimated (``estimated``)
    # [pk, observed value]; planning reads the value as the text messages carry.
    items: list[tuple[Any, datetime | str | None]] | None = None
    partition: Any = None
    start_id: int | None = None
    end_id: int | None = None
    estimated: bool = False


@dataclass(frozen=True)
class Span:
    """Where a run's planning starts and ends; ``frontier`` is None when nothing can be
    eligible (an empty table)."""

    start: int | None
    end: int | None
    frontier: Frontier | None


def span(policy: Policy, frozen: dict[str, datetime], scheme: str) -> Span:
    """Return a new run's key span and its first frontier.

    Ranges: the lowest and highest primary key + 1, read from the ends of the primary
    key index; rows inserted after dispatch lie beyond it and are the next run's.
    Items: the oldest eligible observed value and the cutoff, as epoch seconds, for
    showing the position only; the cursor itself starts before the first row.
    """
    if scheme == ITEMS:
        # Clamped: an observed -infinity reads as year 1, whatever loaders the host has.
        oldest = (policy.eligible_rows(frozen).order_by(policy.observed_field)
                  .values_list(Clamped(policy.observed_field), flat=True).first())
        start = _epoch(oldest) if isinstance(oldest, datetime) else None
        return Span(start, _epoch(frozen["cutoff"]) + 1, AfterItem(None))
    keys = policy.model._default_manager.aggregate(low=Min("pk"), high=Max("pk"))
    if keys["low"] is None:
        return Span(None, None, None)
    first = (NextId(keys["low"]) if policy.partition_column is None
             else PartitionNextId(None, keys["low"]))
    return Span(keys["low"], keys["high"] + 1, first)


def next_chunk(policy: Policy, frozen: dict[str, datetime], scheme: str, frontier: Frontier,
               size: int, *, span_end: int | None = None, max_span: int | None = None,
               density: float | None = None) -> tuple[PlannedChunk | None, Frontier | None]:
    """Plan the chunk at ``frontier``; return it and the frontier after it.

    The chunk is None when nothing eligible is left; the frontier is None once the span
    is done (a chunk can still come with it: the last one). ``density``: ids per
    eligible row where the run's latest chunks tell it (cleanup.engine.sizing.density):
    a range over the whole table is then planned from it, without reading the table.
    """
    if scheme == ITEMS:
        return _next_items(policy, frozen, frontier, size)
    if density is not None and policy.partition_column is None:
        return _estimated_range(frontier, size, density, span_end, max_span)
    return _next_range(policy, frozen, frontier, size, span_end, max_span)


def _estimated_range(frontier, size, density, span_end, max_span):
    """The next half-open [start, end) from the frontier, as wide as ``size`` rows at
    ``density`` ids a row (no wider than ``max_span``, no further than the span's end),
    its rows estimated. Where the estimate was wrong the chunk's statement is still
    right (it carries the whole predicate); a chunk that finds too few rows has its
    successor counted again (sizing.density), which also crosses a stretch where
    nothing is eligible in one probe."""
    start = frontier.next_id
    if span_end is not None and start >= span_end:
        return None, None
    width = max(1, round(size * density))
    if max_span is not None:
        width = min(width, max_span)
    end = start + width if span_end is None else min(start + width, span_end)
    rows = max(1, round((end - start) / density))
    following = NextId(end) if span_end is None or end < span_end else None
    return PlannedChunk(rows, None, None, start, end, estimated=True), following


def _next_range(policy, frozen, frontier, size, span_end, max_span):
    """The next half-open [start, end) of at most ``size`` eligible rows.

    One index probe finds the first eligible id at the frontier (skipping any stretch
    where none is), then one index range read counts ``size`` eligible ids from it (one
    statement for both where the table has no partition column): the range ends after
    the last, so its span follows the density. With ``max_span`` it
    ends no further than that from its start, which bounds the ids its DELETE walks
    where eligible rows thin out.
    """
    column = policy.partition_column
    eligible = policy.eligible_rows(frozen)
    if span_end is not None:
        eligible = eligible.filter(pk__lt=span_end)
    found = (_count_from_frontier(eligible, frontier, size, max_span) if column is None
             else _count_in_partition(eligible, column, frontier, size, max_span))
    if found is None:
        return None, None
    partition, start = found["partition"], found["first"]
    full = found["rows"] == size
    end = found["last"] + 1 if full or max_span is None else start + max_span
    if span_end is not None:
        end = min(end, span_end)
    planned = PlannedChunk(found["rows"], None, partition, start, end)
    following = NextId(end) if column is None else PartitionNextId(json_safe(partition), end)
    if column is None and not full and max_span is None:
        following = None  # nothing eligible is left beyond the last row counted
    return planned, following


def _count_from_frontier(eligible, frontier, size, max_span) -> dict | None:
    """The first eligible id at the frontier, and the count and last of the ``size``
    eligible ids from it, in one statement: its first id and its span bound come from
    one index probe the statement runs first."""
    stretch = eligible.filter(pk__gte=frontier.next_id)
    if max_span is not None:
        first = Subquery(stretch.order_by("pk").values("pk")[:1],
                         output_field=BigIntegerField())
        # From the first eligible id, not the frontier: the ids before it were read
        # once, by the probe.
        stretch = stretch.filter(pk__gte=first, pk__lt=first + max_span)
    found = stretch.order_by("pk")[:size].aggregate(rows=Count("pk"), first=Min("pk"),
                                                    last=Max("pk"))
    return found | {"partition": None} if found["rows"] else None


def _count_in_partition(eligible, column, frontier, size, max_span) -> dict | None:
    """As ``_count_from_frontier``, in the partition of the first eligible row at the
    frontier: one probe finds it, then one index range read counts from it."""
    while True:
        first = _first_eligible(eligible, column, frontier)
        if first is None:
            return None
        partition, start = first
        stretch = eligible.filter(**{column: partition}, pk__gte=start)
        if max_span is not None:
            stretch = stretch.filter(pk__lt=start + max_span)
        found = stretch.order_by("pk")[:size].aggregate(rows=Count("pk"), last=Max("pk"))
        if found["rows"]:
            return found | {"partition": partition, "first": start}
        # The row the probe found stopped being eligible just now: look again past it.
        frontier = PartitionNextId(json_safe(partition), start + 1)


def _first_eligible(eligible, column, frontier) -> tuple[Any, int] | None:
    partition = frontier.partition
    if partition is not None:
        # (partition, pk) >= (p, next id), with a bound the index can seek to.
        eligible = eligible.filter(
            (Q(**{f"{column}__gt": partition}) | Q(pk__gte=frontier.next_id))
            & Q(**{f"{column}__gte": partition})
        )
    return eligible.order_by(column, "pk").values_list(column, "pk").first()


def _next_items(policy, frozen, frontier, size):
    """The next page of at most ``size`` [pk, observed value] pairs, by keyset.

    Pages follow (observed value, pk), the order of the index a policy should have on
    its eligible rows, so each page is a short index range scan. Observed values come
    back as the text the messages carry (ISO-8601, or PostgreSQL's own for what Python
    cannot hold, such as -infinity). Rows whose observed value is NULL (where the
    column allows it) come last, paged by pk alone.
    """
    observed = policy.observed_field
    nullable = policy.model._meta.get_field(observed).null
    eligible = policy.eligible_rows(frozen)
    if isinstance(frontier, AfterItem):
        page = eligible.order_by(observed, "pk")
        if nullable:
            page = page.filter(**{f"{observed}__isnull": False})
        if frontier.after is not None:
            page = page.filter(_after_observed(observed, *frontier.after))
        items = list(page.values_list("pk", ObservedText(observed))[:size])
        if len(items) == size:
            return _page(items), AfterItem((items[-1][1], json_safe(items[-1][0])))
        if not nullable:
            return _page(items), None
        if items:
            # The last page of values; the NULLs follow in the chunk after.
            return _page(items), AfterNull(None)
        frontier = AfterNull(None)
    page = eligible.filter(**{f"{observed}__isnull": True}).order_by("pk")
    if frontier.nulls_after is not None:
        page = page.filter(pk__gt=frontier.nulls_after)
    items = list(page.values_list("pk", ObservedText(observed))[:size])
    following = AfterNull(json_safe(items[-1][0])) if len(items) == size else None
    return _page(items), following


def _page(items):
    return PlannedChunk(rows=len(items), items=items) if items else None


def _after_observed(observed: str, last_text: str, last_pk) -> Q:
    # (observed, pk) > (last observed, last pk), with a bound the index can seek to;
    # PostgreSQL reads the text back, infinities included.
    last = Cast(Value(last_text), DateTimeField())
    return (Q(**{f"{observed}__gt": last}) | Q(pk__gt=last_pk)) & Q(**{f"{observed}__gte": last})


def position(run) -> float | None:
    """How far the run's frontier is through its span, from 0 to 1 (cleanup.engine.frontier)."""
    return frontier_position(run)


def remaining_rows(run) -> int | None:
    """Rows still to plan, estimated from the density of what was planned so far."""
    if run.planned_all:
        return 0
    done = position(run)
    if not done:
        return None
    return round(run.candidates * (1 - done) / done)


def _epoch(moment: datetime) -> int:
    return int(moment.timestamp())


