"""Split what a policy finds eligible at a cutoff into bounded chunks.

Both planners stream: each query reads at most one chunk's worth of rows, so a
backlog of millions never sits in memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, F, Max, Q, Window
from django.db.models.functions import Mod, RowNumber

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
    its eligible rows, so each page is a short index range scan.
    """
    observed = policy.observed_field
    eligible = (
        policy.eligible_rows(cutoff).order_by(observed, "pk").values_list("pk", observed)
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
        after = items[-1]


def plan_ranges(policy: Policy, cutoff: datetime, size: int) -> Iterator[PlannedChunk]:
    """Yield half-open pk ranges per partition, each holding ``size`` eligible rows.

    A partition's ranges tile [its lowest eligible pk, its highest + 1) with no gap
    and no overlap; no range is empty when planned. One streamed query numbers each
    partition's eligible rows by pk and returns only every ``size``-th, so planning
    reads the eligible rows once and holds one boundary at a time.
    """
    column = policy.partition_column
    per_partition = {"partition_by": [F(column)]}
    starts = (
        policy.eligible_rows(cutoff)
        .annotate(
            position=Window(RowNumber(), order_by=F("pk").asc(), **per_partition),
            total=Window(Count("pk"), **per_partition),
            last=Window(Max("pk"), **per_partition),
        )
        .alias(offset=Mod(F("position") - 1, size))
        .filter(offset=0)
        .order_by(column, "pk")
        .values_list(column, "pk", "position", "total", "last")
    )
    previous = None
    for current in starts.iterator(chunk_size=2000):
        if previous is not None:
            yield _range(previous, current, size)
        previous = current
    if previous is not None:
        yield _range(previous, None, size)


def _range(start: tuple, following: tuple | None, size: int) -> PlannedChunk:
    partition, start_id, position, total, last = start
    if following is not None and following[0] == partition:
        return PlannedChunk(size, None, partition, start_id, following[1])
    # The partition's last range: up to its highest eligible pk.
    return PlannedChunk(total - position + 1, None, partition, start_id, last + 1)
