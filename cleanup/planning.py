"""Split what a policy finds eligible at a cutoff into bounded chunks.

Both planners stream: each query reads at most one chunk's worth of rows, so a
backlog of millions never sits in memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, Max, Q

from cleanup.policies import ITEMS, Policy


@dataclass(frozen=True)
class PlannedChunk:
    rows: int
    items: list[tuple[Any, datetime]] | None = None
    partition: Any = None
    start_id: int | None = None
    end_id: int | None = None


def plan(policy: Policy, cutoff: datetime, scheme: str) -> Iterator[PlannedChunk]:
    if scheme == ITEMS:
        return plan_items(policy, cutoff)
    return plan_ranges(policy, cutoff)


def plan_items(policy: Policy, cutoff: datetime) -> Iterator[PlannedChunk]:
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
        items = list(page[: policy.chunk_size])
        if not items:
            return
        yield PlannedChunk(rows=len(items), items=items)
        if len(items) < policy.chunk_size:
            return
        after = items[-1]


def plan_ranges(policy: Policy, cutoff: datetime) -> Iterator[PlannedChunk]:
    """Yield half-open pk ranges per partition, each holding chunk_size eligible rows.

    A partition's ranges tile [its lowest eligible pk, its highest + 1) with no gap
    and no overlap; no range is empty when planned.
    """
    column = policy.partition_column
    eligible = policy.eligible_rows(cutoff)
    partitions = eligible.order_by(column).values_list(column, flat=True).distinct()
    for partition in list(partitions):
        rows = eligible.filter(**{column: partition}).order_by("pk")
        start = rows.values_list("pk", flat=True).first()
        while start is not None:
            # The chunk's last row and the next chunk's first, found by the index.
            ahead = list(
                rows.filter(pk__gte=start).values_list("pk", flat=True)[
                    policy.chunk_size - 1 : policy.chunk_size + 1
                ]
            )
            if len(ahead) == 2:
                yield PlannedChunk(policy.chunk_size, None, partition, start, ahead[1])
                start = ahead[1]
                continue
            if ahead:
                yield PlannedChunk(policy.chunk_size, None, partition, start, ahead[0] + 1)
            else:
                tail = rows.filter(pk__gte=start).aggregate(last=Max("pk"), count=Count("pk"))
                yield PlannedChunk(tail["count"], None, partition, start, tail["last"] + 1)
            start = None
