"""Split what a policy finds eligible under a run's frozen parameters into bounded chunks.

Both planners stream (items a page of one chunk at a time, ranges only the rows that
open or close a range), so a backlog of millions never sits in memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import DateTimeField, F, Q, Value, Window
from django.db.models.functions import Cast, Lead, Mod, RowNumber

from cleanup.expressions import ObservedText
from cleanup.policies import ITEMS, Policy


@dataclass(frozen=True)
class PlannedChunk:
    rows: int
    # [pk, observed value]; planning reads the value as the text messages carry.
    items: list[tuple[Any, datetime | str | None]] | None = None
    partition: Any = None
    start_id: int | None = None
    end_id: int | None = None


def plan(
    policy: Policy, frozen: dict[str, datetime], scheme: str, size: int,
    max_span: int | None = None,
) -> Iterator[PlannedChunk]:
    """Plan the chunks of what ``policy`` finds eligible under a run's frozen parameters."""
    if scheme == ITEMS:
        return plan_items(policy, frozen, size)
    return plan_ranges(policy, frozen, size, max_span)


def plan_items(policy: Policy, frozen: dict[str, datetime], size: int) -> Iterator[PlannedChunk]:
    """Yield chunks of [pk, observed value] pairs, by keyset pagination.

    Pages follow (observed value, pk), the order of the index a policy should have on
    its eligible rows, so each page is a short index range scan. Observed values come
    back as the text the messages carry (ISO-8601, or PostgreSQL's own for what Python
    cannot hold, such as -infinity): parsing a million timestamps and formatting them
    again took longer than the queries. Rows whose observed value is NULL (where the
    column allows it) come last, paged by pk alone.
    """
    observed = policy.observed_field
    eligible = (
        policy.eligible_rows(frozen)
        .order_by(observed, "pk")
        .values_list("pk", ObservedText(observed))
    )
    if not policy.model._meta.get_field(observed).null:
        yield from _pages(eligible, size, _after_observed(observed))
        return
    yield from _pages(eligible.filter(**{f"{observed}__isnull": False}), size,
                      _after_observed(observed))
    yield from _pages(eligible.filter(**{f"{observed}__isnull": True}), size,
                      lambda last_pk, _: Q(pk__gt=last_pk))


def _pages(eligible, size: int, after) -> Iterator[PlannedChunk]:
    """Yield pages of at most ``size`` items, each starting after the last one's item."""
    page = eligible
    while True:
        items = list(page[:size])
        if items:
            yield PlannedChunk(rows=len(items), items=items)
        if len(items) < size:
            return
        page = eligible.filter(after(*items[-1]))


def _after_observed(observed: str):
    def after(last_pk, last_text: str) -> Q:
        # (observed, pk) > (last observed, last pk), with a bound the index can seek to;
        # PostgreSQL reads the text back, infinities included.
        last = Cast(Value(last_text), DateTimeField())
        return (Q(**{f"{observed}__gt": last}) | Q(pk__gt=last_pk)) & Q(
            **{f"{observed}__gte": last}
        )

    return after


def plan_ranges(
    policy: Policy, frozen: dict[str, datetime], size: int, max_span: int | None = None
) -> Iterator[PlannedChunk]:
    """Yield half-open pk ranges per partition (or over the whole table) of at most
    ``size`` eligible rows.

    With ``max_span``, no range spans more than ``max_span`` ids.
    A partition's ranges are disjoint, in pk order, cover every eligible row, and none
    is empty when planned. They tile its eligible span except where a range had to be
    cut to ``max_span``: there they skip ids where no row is eligible, without visiting
    them. That bounds the ids a DELETE walks through where eligible rows thin out (a
    backlog's newest edge), which counting eligible rows alone does not.

    One streamed query numbers each partition's eligible rows by pk and returns only
    every ``size``-th and the last, in index order when an index on (partition, pk)
    covers the predicate; a range found too wide reads its own ids to be cut.
    """
    column = policy.partition_column
    eligible = policy.eligible_rows(frozen)
    # Without a partition column, one partition: the whole table.
    by_pk = {"partition_by": [F(column)] if column else None, "order_by": F("pk").asc()}
    grouping = [column] if column else []
    boundaries = (
        eligible.annotate(
            position=Window(RowNumber(), **by_pk),
            following=Window(Lead("pk"), **by_pk),
            offset=Mod(F("position") - 1, size),
        )
        .filter(Q(offset=0) | Q(following__isnull=True))
        .order_by(*grouping, "pk")
        .values_list(*grouping, "pk", "position", "offset", "following")
    )

    start = None  # (pk, position) of the range being filled
    for row in boundaries.iterator(chunk_size=2000):
        partition, (pk, position, offset, following) = (
            (row[0], row[1:]) if column else (None, row))
        if offset == 0:
            if start is not None:
                # Same partition: the range ends where the next one starts.
                yield from _within_span(eligible, column, partition, start[0], pk,
                                        position - start[1], max_span)
            start = (pk, position)
        if following is None:
            # The partition's last eligible row closes its last range.
            yield from _within_span(eligible, column, partition, start[0], pk + 1,
                                    position - start[1] + 1, max_span)
            start = None


def _within_span(eligible, column: str | None, partition, start: int, end: int, rows: int,
                 max_span: int | None) -> Iterator[PlannedChunk]:
    """Yield [start, end) as planned, or cut into ranges no wider than ``max_span``
    around the eligible ids it holds now."""
    if max_span is None or end - start <= max_span:
        yield PlannedChunk(rows, None, partition, start, end)
        return
    ids = (
        eligible.filter(**({column: partition} if column else {}), pk__gte=start, pk__lt=end)
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    group: list[int] = []
    for pk in ids:
        if group and pk - group[0] >= max_span:
            yield PlannedChunk(len(group), None, partition, group[0], group[-1] + 1)
            group = []
        group.append(pk)
    # Read after the boundaries: rows deleted or renewed since may have emptied it.
    if group:
        yield PlannedChunk(len(group), None, partition, group[0], group[-1] + 1)
