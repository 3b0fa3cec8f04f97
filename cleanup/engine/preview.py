"""What a dispatch would do, counted without planning or writing anything."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from math import ceil

from django.db.models import Count

from cleanup.policies import ITEMS, Policy

WHOLE_TABLE = "whole table"


@dataclass(frozen=True)
class Preview:
    rows_by_partition: dict
    chunks: int

    @property
    def rows(self) -> int:
        return sum(self.rows_by_partition.values())


def preview(policy: Policy, cutoff: datetime, scheme: str, size: int) -> Preview:
    """Count eligible rows per partition (tenant) and the chunks planning would make.

    Both planners fill every chunk but the last (per partition, for ranges), so the
    chunk count follows from the row counts; for ranges it is a lower bound, since a
    range wider than the run's span cap is cut further when planned.
    """
    column = policy.partition_column
    eligible = policy.eligible_rows(policy.freeze(cutoff))
    if column is None:  # ranges over the whole table
        rows = eligible.count()
        rows_by_partition = {WHOLE_TABLE: rows} if rows else {}
    else:
        rows_by_partition = dict(
            eligible.values_list(column).annotate(rows=Count("pk")).order_by(column))
    if scheme == ITEMS:
        chunks = ceil(sum(rows_by_partition.values()) / size)
    else:
        chunks = sum(ceil(n / size) for n in rows_by_partition.values())
    return Preview(rows_by_partition, chunks)
