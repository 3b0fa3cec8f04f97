"""Split what a policy finds eligible at a cutoff into bounded chunks.

Both planners stream: each query reads at most one chunk's worth of rows, so a
backlog of millions never sits in memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import CharField, F, Func, Q, Window
from django.db.models.functions import Lead, Mod, RowNumber

from cleanup.policies import ITEMS, Policy


@dataclass(frozen=True)
class PlannedChunk:
    rows: int
    items: list[tuple[Any, datetime]] | None = None
    partition: Any = None
    start_id: int | None = None
    end_id: int | None = None


def plan(policy: Policy, cutoff: datetime, scheme: str, size: int) -> Iterator[PlannedChunk]:
    if scheme == ITEMS:
        return plan_items(policy, cutoff, size)
    return plan_ranges(policy, cutoff, size)


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


def plan_ranges(policy: Policy, cutoff: datetime, size: int) -> Iterator[PlannedChunk]:
    """Yield half-open pk ranges per partition, each holding ``size`` eligible rows.

    A partition's ranges tile [its lowest eligible pk, its highest + 1) with no gap
    and no overlap; no range is empty when planned. One streamed query numbers each
    partition's eligible rows by pk and returns only every ``size``-th and the last,
    so planning reads the eligible rows once, in index order when an index on
    (partition, pk) covers the predicate, and holds one boundary at a time.
    """
    column = policy.partition_column
    by_pk = {"partition_by": [F(column)], "order_by": F("pk").asc()}
    boundaries = (
        policy.eligible_rows(cutoff)
        .annotate(position=Window(RowNumber(), **by_pk), following=Window(Lead("pk"), **by_pk))
        .annotate(offset=Mod(F("position") - 1, size))
        .filter(Q(offset=0) | Q(following__isnull=True))
        .order_by(column, "pk")
        .values_list(column, "pk", "position", "offset", "following")
    )
    start = None  # (partition, pk, position) of the range being filled
    for partition, pk, position, offset, following in boundaries.iterator(chunk_size=2000):
        if offset == 0:
            if start is not None and start[0] == partition:
                yield PlannedChunk(size, None, partition, start[1], pk)
            start = (partition, pk, position)
        if following is None:
            # The partition's last eligible row closes its last range.
            yield PlannedChunk(position - start[2] + 1, None, partition, start[1], pk + 1)
            start = None
