"""How many rows a chunk holds: a transaction-time budget, followed within the run.

A chunk's transaction holds its rows' locks (a renewal of one of them waits for it),
so its size is chosen from time, not rows: as many rows as chunks got through within
``CLEANUP_CHUNK_BUDGET_MS`` at their median pace, between a floor and a per-scheme
ceiling. A new run starts from the policy's recent runs (or the policy's own
``chunk_size`` without them); then each next chunk follows the pace of the run's own
latest chunks, changing by at most ``STEP`` times per chunk planned, so a first run on
an empty ledger reaches its budgeted size within a handful of chunks and one slow chunk
(a lock wait) does not collapse the size.
"""

from __future__ import annotations

from cleanup.conf import conf
from cleanup.models import Chunk, Run
from cleanup.policies import ITEMS, Policy

# Recent chunks the rate is learned from, and how many are enough to trust it.
HISTORY = 50
ENOUGH = 5
RUNS = 5
# A range chunk may span this many times the ids a typical full one spans.
SPAN_FACTOR = 2
# Within a run: the latest chunks whose pace sets the next size, and the most the size
# changes from one chunk to the next (either way).
LATEST = 3
STEP = 2
# The share of the time budget a chunk learns against while its locks make others wait.
SLOW_BUDGET_SHARE = 0.25


def chunk_size(policy: Policy, scheme: str) -> int:
    """Return the rows per chunk for a new run of ``policy`` under ``scheme``."""
    if not conf.CHUNK_BUDGET_MS:
        return policy.chunk_size
    history = list(_recent(policy, scheme).values("planned_rows", "duration_ms"))
    if len(history) < ENOUGH:
        return policy.chunk_size
    # The median chunk's pace: a few chunks that met a lock or a sparse stretch of ids
    # do not shrink the size for the rest. Durations are whole milliseconds.
    paces = sorted(chunk["planned_rows"] / max(chunk["duration_ms"], 1) for chunk in history)
    learned = int(conf.CHUNK_BUDGET_MS * paces[len(paces) // 2])
    ceiling = conf.MAX_ITEMS_PER_CHUNK if scheme == ITEMS else conf.MAX_RANGE_ROWS_PER_CHUNK
    return max(conf.MIN_ROWS_PER_CHUNK, min(learned, ceiling))


def max_span(policy: Policy, scheme: str, size: int) -> int | None:
    """Return the widest id span for a new run's range chunks, or None for no cap.

    ``SPAN_FACTOR`` times the span of ``size`` rows at the median density of recent
    range chunks: where eligible rows thin out, a range is cut short rather than
    letting its DELETE walk through many ids that are not eligible.
    """
    if scheme == ITEMS or not conf.CHUNK_BUDGET_MS:
        return None
    history = list(
        _recent(policy, scheme).values_list("planned_rows", "message__start_id",
                                            "message__end_id")
    )
    if len(history) < ENOUGH:
        return None
    spans = sorted((end - start) / rows for rows, start, end in history
                   if isinstance(start, int) and isinstance(end, int))
    if len(spans) < ENOUGH:
        return None
    return max(1, round(SPAN_FACTOR * size * spans[len(spans) // 2]))


def next_size(run, policy: Policy, *, slow: bool = False) -> tuple[int, int | None]:
    """Return the rows and the widest id span (ranges) of the run's next chunk.

    From the median pace of the run's latest done chunks, bounded as for a new run and
    at most ``STEP`` times the current size either way; the span cap follows the
    density those chunks found. Unchanged until a chunk of the run is done. ``slow``
    (the policy's chunks make other sessions wait on their locks) learns against
    ``SLOW_BUDGET_SHARE`` of the budget, so chunks shrink a step at a time until the
    waits stop, then grow back.
    """
    current = run.next_chunk_size or run.chunk_size or policy.chunk_size
    if not conf.CHUNK_BUDGET_MS:
        return current, run.max_span
    fields = ["planned_rows", "duration_ms"]
    if run.scheme != ITEMS:  # an items message is large and carries no span: left unread
        fields += ["message__start_id", "message__end_id"]
    latest = list(
        Chunk.objects.filter(run=run, state__in=Chunk.DONE, duration_ms__isnull=False,
                             planned_rows__gt=0)
        .order_by("-committed_at")
        .values_list(*fields)[:LATEST]
    )
    if not latest:
        return current, run.max_span
    paces = sorted(row[0] / max(row[1], 1) for row in latest)
    budget = conf.CHUNK_BUDGET_MS * (SLOW_BUDGET_SHARE if slow else 1)
    learned = int(budget * paces[len(paces) // 2])
    ceiling = conf.MAX_ITEMS_PER_CHUNK if run.scheme == ITEMS else conf.MAX_RANGE_ROWS_PER_CHUNK
    size = max(current // STEP, min(learned, current * STEP))
    size = max(conf.MIN_ROWS_PER_CHUNK, min(size, ceiling))
    spans = sorted((row[3] - row[2]) / row[0] for row in latest
                   if len(row) == 4 and isinstance(row[2], int) and isinstance(row[3], int))
    if not spans:
        return size, None
    return size, max(1, round(SPAN_FACTOR * size * spans[len(spans) // 2]))


def _recent(policy: Policy, scheme: str):
    """The policy's latest done chunks of this scheme, from its last few runs only (found
    through the run index), so a long ledger is not sorted under the policy's lock."""
    runs = Run.objects.filter(policy=policy.name, scheme=scheme).order_by("-created_at")
    return (
        Chunk.objects.filter(run__in=runs[:RUNS], state__in=Chunk.DONE,
                             duration_ms__isnull=False, planned_rows__gt=0)
        .order_by("-committed_at")[:HISTORY]
    )
