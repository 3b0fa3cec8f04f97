"""How many rows a new run puts in each chunk: a transaction-time budget, learned.

A chunk's transaction holds its rows' locks (a renewal of one of them waits for it),
so its size is chosen from time, not rows: as many rows as recent chunks of the same
policy and scheme got through within ``CLEANUP_CHUNK_BUDGET_MS`` at their median pace,
between a floor and a per-scheme ceiling. Without enough history the policy's own
``chunk_size`` is used.
"""

from __future__ import annotations

from cleanup.conf import conf
from cleanup.models import Chunk
from cleanup.policies import ITEMS, Policy

# Recent chunks the rate is learned from, and how many are enough to trust it.
HISTORY = 50
ENOUGH = 5


def chunk_size(policy: Policy, scheme: str) -> int:
    """Return the rows per chunk for a new run of ``policy`` under ``scheme``."""
    if not conf.CHUNK_BUDGET_MS:
        return policy.chunk_size
    recent = (
        Chunk.objects.filter(run__policy=policy.name, run__scheme=scheme,
                             state__in=Chunk.DONE, duration_ms__isnull=False,
                             planned_rows__gt=0)
        .order_by("-committed_at")
        .values("planned_rows", "duration_ms")[:HISTORY]
    )
    history = list(recent)
    if len(history) < ENOUGH:
        return policy.chunk_size
    # The median chunk's pace: a few chunks that met a lock or a sparse stretch of ids
    # do not shrink the size for the rest. Durations are whole milliseconds.
    paces = sorted(chunk["planned_rows"] / max(chunk["duration_ms"], 1) for chunk in history)
    learned = int(conf.CHUNK_BUDGET_MS * paces[len(paces) // 2])
    ceiling = conf.MAX_ITEMS_PER_CHUNK if scheme == ITEMS else conf.MAX_RANGE_ROWS_PER_CHUNK
    return max(conf.MIN_ROWS_PER_CHUNK, min(learned, ceiling))
