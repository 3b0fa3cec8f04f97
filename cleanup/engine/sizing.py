"""How many rows a chunk holds: a transaction-time budget, followed within the run.

A chunk's transaction holds its rows' locks (a renewal of one of them waits for it),
so its size is chosen from time, not rows: as many rows as chunks got through within
``CLEANUP_CHUNK_BUDGET_MS`` at their median pace, between a floor and a per-scheme
ceiling. A new run starts from the policy's recent runs (or the policy's own
``chunk_size`` without them); then each next chunk follows the pace of the run's own
latest chunks, changing by at most ``STEP`` times per chunk planned, so a first run on
an empty ledger reaches its budgeted size within a handful of chunks and one slow chunk
(a lock wait) does not collapse the size.

A pace is the database's: rows per millisecond of the chunk's transaction, less the
time its worker waited for a CPU (cleanup.engine.cpu_wait), but never less than half
of it. A slow database makes the chunks smaller, which is the budget's purpose; a busy
client does not, since smaller chunks would only add per-chunk work for its busy CPUs,
and its chunks still hold their locks for at most twice the budget. A new run starts
from the fastest of the recent runs' median paces, so a run that met a passing load
does not set the next one's start, but from at most ``STEP`` times the latest run's:
if the database has become slower, the new run's first window is not planned for the
database of five runs ago.
"""

from __future__ import annotations

from django.db.models import F, Window
from django.db.models.functions import RowNumber

from cleanup.conf import conf
from cleanup.engine import transitions
from cleanup.models import ROWS_CHANGED, Chunk, Run
from cleanup.policies import ITEMS, Policy

# A new run learns from the latest PER_RUN chunks of each of the policy's last RUNS
# runs; ENOUGH chunks are enough to trust a pace.
RUNS = 5
PER_RUN = 10
ENOUGH = 5
# What a pace is read from; and the most of a chunk's time taken for its worker's wait
# for a CPU rather than the database's work.
PACE_FIELDS = ("planned_rows", "duration_ms", "cpu_wait_ms")
MAX_CPU_WAIT_SHARE = 0.5
# A range chunk may span this many times the ids a typical full one spans.
SPAN_FACTOR = 2
# Within a run: the latest chunks whose pace sets the next size, and the most the size
# changes from one chunk to the next (either way).
LATEST = 3
STEP = 2
# The share of the time budget a chunk learns against while its locks make others wait.
SLOW_BUDGET_SHARE = 0.25
# A range's next chunk is planned from the density of the latest ones (not counted) once
# the newest found at least this share of the rows planned for it.
DENSE_SHARE = 0.5


def chunk_size(policy: Policy, scheme: str) -> int:
    """Return the rows per chunk for a new run of ``policy`` under ``scheme``."""
    if not conf.CHUNK_BUDGET_MS:
        return policy.chunk_size
    runs = _recent_runs(policy, scheme)
    history = list(_recent(runs).annotate(changed=ROWS_CHANGED + F("rows_locked"))
                   .values("run_id", *PACE_FIELDS, "rows_estimated", "changed"))
    if len(history) < ENOUGH:
        return policy.chunk_size
    per_run: dict[object, list[float]] = {run_id: [] for run_id in runs}
    for chunk in history:
        per_run[chunk["run_id"]].append(_pace(chunk))
    # Each run's median chunk (a few that met a lock or a sparse stretch of ids do not
    # shrink the size for the rest), newest run first; runs too short to say anything
    # alone are taken together.
    medians = [_median(paces) for paces in per_run.values() if len(paces) >= ENOUGH]
    if medians:
        pace = min(max(medians), STEP * medians[0])
    else:
        pace = _median([_pace(chunk) for chunk in history])
    learned = int(conf.CHUNK_BUDGET_MS * pace)
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
        _recent(_recent_runs(policy, scheme)).values_list("planned_rows", "message__start_id",
                                                          "message__end_id")
    )
    if len(history) < ENOUGH:
        return None
    spans = sorted((end - start) / rows for rows, start, end in history
                   if isinstance(start, int) and isinstance(end, int))
    if len(spans) < ENOUGH:
        return None
    return max(1, round(SPAN_FACTOR * size * spans[len(spans) // 2]))


def next_size(run, policy: Policy, *, latest: list[dict] | None = None,
              slow: bool = False) -> tuple[int, int | None]:
    """Return the rows and the widest id span (ranges) of the run's next chunk.

    From the median pace of the run's latest done chunks (``latest``, if read with the
    run: ``transitions.lock_run``), bounded as for a new run and at most ``STEP`` times the
    current size either way; the span cap follows the density those chunks found.
    Unchanged until a chunk of the run is done. ``slow`` (the policy's chunks make other
    sessions wait on their locks) learns against ``SLOW_BUDGET_SHARE`` of the budget, so
    chunks shrink a step at a time until the waits stop, then grow back.
    """
    current = run.next_chunk_size or run.chunk_size or policy.chunk_size
    if not conf.CHUNK_BUDGET_MS:
        return current, run.max_span
    if latest is None:
        latest = transitions.latest_chunks(run.pk, LATEST)
    if not latest:
        return current, run.max_span
    budget = conf.CHUNK_BUDGET_MS * (SLOW_BUDGET_SHARE if slow else 1)
    learned = int(budget * _median([_pace(chunk) for chunk in latest]))
    ceiling = conf.MAX_ITEMS_PER_CHUNK if run.scheme == ITEMS else conf.MAX_RANGE_ROWS_PER_CHUNK
    size = max(current // STEP, min(learned, current * STEP))
    size = max(conf.MIN_ROWS_PER_CHUNK, min(size, ceiling))
    spans = sorted(
        (chunk["message__end_id"] - chunk["message__start_id"]) / chunk["planned_rows"]
        for chunk in latest
        if isinstance(chunk.get("message__start_id"), int)
        and isinstance(chunk.get("message__end_id"), int))
    if not spans:
        return size, None
    return size, max(1, round(SPAN_FACTOR * size * spans[len(spans) // 2]))


def density(latest: list[dict] | None) -> float | None:
    """Ids per eligible row in the run's latest range chunks (the median), if its newest
    one found at least ``DENSE_SHARE`` of the rows planned for it; else None, and the
    next range is counted (cleanup.engine.planning). Planned rows that were estimated
    are not evidence: the rows a chunk changed or found locked are."""
    spans = sorted(
        (chunk["message__end_id"] - chunk["message__start_id"]) / chunk["changed"]
        for chunk in latest or ()
        if isinstance(chunk.get("message__start_id"), int)
        and isinstance(chunk.get("message__end_id"), int) and chunk.get("changed"))
    if not spans or latest[0].get("changed", 0) < DENSE_SHARE * latest[0]["planned_rows"]:
        return None
    return spans[len(spans) // 2]


def _pace(chunk: dict) -> float:
    """Rows per millisecond of the database's time (whole milliseconds in the ledger):
    its planned rows, or those it changed where they were estimated."""
    duration = chunk["duration_ms"]
    waited = min(chunk["cpu_wait_ms"] or 0, duration * MAX_CPU_WAIT_SHARE)
    rows = chunk.get("changed", 0) if chunk.get("rows_estimated") else chunk["planned_rows"]
    return rows / max(duration - waited, 1)


def _median(values: list[float]) -> float:
    """The middle value (the upper one of an even count)."""
    return sorted(values)[len(values) // 2]


def _recent_runs(policy: Policy, scheme: str) -> list:
    """Ids of the policy's last ``RUNS`` runs of this scheme, newest first (through the
    run index, so a long ledger is not sorted under the policy's lock)."""
    return list(Run.objects.filter(policy=policy.name, scheme=scheme)
                .order_by("-created_at", "-pk").values_list("pk", flat=True)[:RUNS])


def _done(chunks):
    """The chunks a pace can be read from: done, timed, and planned with rows."""
    return chunks.filter(state__in=Chunk.DONE, duration_ms__isnull=False, planned_rows__gt=0)


def _recent(run_ids: list):
    """The latest ``PER_RUN`` done chunks of each of the runs."""
    return (
        _done(Chunk.objects.filter(run__in=run_ids))
        .order_by()
        .annotate(latest=Window(RowNumber(), partition_by=[F("run_id")],
                                order_by=[F("committed_at").desc(), F("pk").desc()]))
        .filter(latest__lte=PER_RUN)
    )
