"""What a dispatch would do, counted without planning or writing anything."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from math import ceil

from django.db.models import Count

from cleanup.conf import conf
from cleanup.display import number
from cleanup.policies import ITEMS, Policy

WHOLE_TABLE = "whole table"


@dataclass(frozen=True)
class Preview:
    rows_by_partition: dict
    chunks: int
    # The rows of the run's first chunks, which the count assumes throughout.
    chunk_rows: int = 0
    # Whether the run's chunks grow past chunk_rows as it learns the database's pace
    # (cleanup.engine.sizing): then the count is what the first size would take.
    grows: bool = False

    @property
    def rows(self) -> int:
        return sum(self.rows_by_partition.values())

    @property
    def sizing(self) -> str:
        """What the chunk count assumes, as the dry run and the console's preview say it
        (nothing when nothing is eligible)."""
        if not self.chunks:
            return ""
        if self.grows and self.chunks > 1:
            return (f"counted at its first chunks' size ({number(self.chunk_rows)} rows): a "
                    "run's chunks grow as it learns the database's pace, so it usually takes "
                    "fewer")
        return f"{number(self.chunk_rows)} rows a chunk"


def preview(policy: Policy, cutoff: datetime, scheme: str, size: int) -> Preview:
    """Count eligible rows per partition (tenant) and the chunks planning would make.

    Both planners fill every chunk but the last (per partition, for ranges), so the
    chunk count follows from the row counts at the first chunks' ``size``. A run
    learning its pace grows its chunks from there (up to the scheme's ceiling), so it
    usually takes fewer; for ranges a range wider than the run's span cap is cut
    further when planned.
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
    ceiling = conf.MAX_ITEMS_PER_CHUNK if scheme == ITEMS else conf.MAX_RANGE_ROWS_PER_CHUNK
    grows = bool(conf.CHUNK_BUDGET_MS) and size < ceiling
    return Preview(rows_by_partition, chunks, chunk_rows=size, grows=grows)
