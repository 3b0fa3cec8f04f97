"""Split what a policy finds eligible at a cutoff into bounded chunks.

Both planners stream: each query reads at most one chunk's worth of rows, so a
backlog of millions never sits in memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import (
    BigIntegerField,
    CharField,
    ExpressionWrapper,
    F,
    Func,
    Q,
    Value,
    Window,
)
from django.db.models.functions import Lag, Lead, Mod, RowNumber

from cleanup.policies import ITEMS, Policy


@dataclass(frozen=True)
class PlannedChunk:
    rows: int
    items: list[tuple[Any, datetime]] | None = None
    partition: Any = None
    start_id: int | None = None
    end_id: int | None = None


def plan(
    policy: Policy, cutoff: datetime, scheme: str, size: int, max_span: int | None = None
) -> Iterator[PlannedChunk]:
    if scheme == ITEMS:
        return plan_items(policy, cutoff, size)
    return plan_ranges(policy, cutoff, size, max_span)


def plan_items(policy: Policy, cutoff: datetime, size: int) -> Iterator[PlannedChunk]:
    """Yield chunks of [pk, observed value] pairs, by keyset pagination.

    Pages follow (observed value, pk), the order of the index a policy should have on
    its eligible rows, so each page is a short index range scan. Observed values come
    back as the ISO-8601 text the messages carry: parsing a million timestamps and
    formatting them again took longer than the queries.
    """
    observed = policy.observed_field
    eligible = (
        policy.eligible_rows(cutoff)
        .order_by(observed, "pk")
        .values_list("pk", IsoTimestamp(observed))
    )
    after = None
    while True:
        page = eligible
        if after is not None:
            last_pk, last_observed = after
            # (observed, pk) > (last_observed, last_pk), with a bound the index can seek to.
            page = eligible.filter(
                Q(**{f"{observed}__gt": last_observed}) | Q(pk__gt=last_pk),
                **{f"{observed}__gte": last_observed},
            )
        items = list(page[:size])
        if not items:
            return
        yield PlannedChunk(rows=len(items), items=items)
        if len(items) < size:
            return
        last_pk, last_text = items[-1]
        after = (last_pk, datetime.fromisoformat(last_text))


class IsoTimestamp(Func):
    """A timestamptz as ISO-8601 text in UTC with microseconds, as Python reads it."""

    template = (
        "to_char(%(expressions)s AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"+00:00\"')"
    )
    output_field = CharField()


def plan_ranges(
    policy: Policy, cutoff: datetime, size: int, max_span: int | None = None
) -> Iterator[PlannedChunk]:
    """Yield half-open pk ranges per partition, each holding at most ``size`` eligible
    rows and, with ``max_span``, lying inside one cell of a grid ``max_span`` ids wide.

    Ranges of a partition are disjoint, in pk order, cover every eligible row, and none
    is empty when planned. Within a cell they tile; between cells they skip ids where no
    row is eligible, without visiting them. The grid bounds the ids a range's DELETE
    walks through where eligible rows are sparse (a backlog's newest edge), which a
    count of eligible rows alone does not.

    One streamed query numbers each partition's eligible rows by pk and returns only
    the rows that open or close a range, in index order when an index on
    (partition, pk) covers the predicate; planning holds one range at a time.
    """
    column = policy.partition_column
    by_pk = {"partition_by": [F(column)], "order_by": F("pk").asc()}
    boundaries = policy.eligible_rows(cutoff).annotate(
        position=Window(RowNumber(), **by_pk),
        following=Window(Lead("pk"), **by_pk),
        offset=Mod(F("position") - 1, size),
    )
    opens, closes = Q(offset=0), Q(following__isnull=True)
    cells = ()
    if max_span:
        # Integer division: the grid cell of an id, of the previous and the next row.
        boundaries = boundaries.annotate(
            cell=_cell(F("pk"), max_span),
            previous_cell=Window(Lag(_cell(F("pk"), max_span)), **by_pk),
            next_cell=_cell(F("following"), max_span),
        )
        opens |= ~Q(cell=F("previous_cell"))
        closes |= ~Q(cell=F("next_cell"))
        cells = ("cell", "previous_cell", "next_cell")
    rows = (
        boundaries.filter(opens | closes)
        .order_by(column, "pk")
        .values_list(column, "pk", "position", "offset", "following", *cells)
    )
    start = None  # (pk, position) of the open range
    for partition, pk, position, offset, following, *grid in rows.iterator(chunk_size=2000):
        cell, previous_cell, next_cell = grid or (None, None, None)
        if offset == 0 or cell != previous_cell:
            if start is not None:
                # Same partition and cell: the range ends where the next one starts.
                yield PlannedChunk(position - start[1], None, partition, start[0], pk)
            start = (pk, position)
        if following is None or cell != next_cell:
            yield PlannedChunk(position - start[1] + 1, None, partition, start[0], pk + 1)
            start = None


def _cell(ids, width: int):
    return ExpressionWrapper(ids / Value(width), output_field=BigIntegerField())
