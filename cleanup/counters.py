"""The ledger's counters, summed per policy: what /metrics reports as *_total.

The same sums are taken over the rows a retention purge is about to delete and
added to LedgerTotal first, so purging the ledger never makes a counter go down.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

from django.db import IntegrityError, connection, models, transaction
from django.db.models import Count, F, Max, Q, Sum, Value
from django.db.models.lookups import LessThanOrEqual

from cleanup.models import Chunk, LedgerTotal, Run

DURATION_BUCKETS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)
ROWS_BUCKETS = (0, 1, 10, 50, 100, 250, 500, 1000, 2500, 5000)

_committed = Q(committed_at__isnull=False)
_timed = _committed & Q(duration_ms__isnull=False)
# What a chunk's statement changed, whichever its policy's mutation.
ROWS_CHANGED = F("rows_deleted") + F("rows_updated")

CHUNK_SUMS = {
    "deliveries": Sum("deliveries"),
    "rows_deleted": Sum("rows_deleted"),
    "rows_updated": Sum("rows_updated"),
    "noop": Sum("noop_deliveries"),
    "items_skipped": Sum("items_skipped"),
    "retryable_failures": Sum("transient_retries") + Sum("failures"),
    "chunks_committed": Count("pk", filter=_committed),
    "dead_lettered": Sum("dead_letters"),
    "reconciled": Sum("reconciles"),
    "duration_count": Count("pk", filter=_timed),
    "duration_sum_ms": Sum("duration_ms", filter=_timed),
    **{f"duration_le_{b}": Count("pk", filter=_timed & Q(duration_ms__lte=b))
       for b in DURATION_BUCKETS_MS},
    # The rows histogram counts rows changed (deleted, or updated).
    "rows_count": Count("pk", filter=_committed),
    "rows_sum": Sum(ROWS_CHANGED, filter=_committed),
    **{f"rows_le_{b}": Count("pk", filter=_committed & Q(LessThanOrEqual(ROWS_CHANGED, b)))
       for b in ROWS_BUCKETS},
}


# Gauges read in the same pass over the chunks as the counters; never rolled up.
STATE_COUNTS = {f"state_{state}": Count("pk", filter=Q(state=state))
                for state in Chunk.State.values}


def chunk_sums(chunks: models.QuerySet) -> dict[str, dict[str, int]]:
    """The counters of these chunks, per policy (what a purge rolls up)."""
    return _chunk_aggregates(chunks, CHUNK_SUMS)


def run_sums(runs: models.QuerySet) -> dict[str, dict[str, int]]:
    """The counters of these runs, per policy (what a purge rolls up)."""
    return _run_aggregates(runs)[0]


@dataclass(frozen=True)
class LedgerFigures:
    """What one scrape reads from the ledger, in one pass over each table."""

    sums: dict[str, dict[str, int]]  # counters per policy, purged rows included
    states: dict[str, dict[str, int]]  # chunks per policy and current state
    running: dict[str, int]  # runs per policy not finished yet
    last_success: dict[str, datetime]  # when each policy's last completed run finished


def ledger_figures() -> LedgerFigures:
    """Counters (live rows plus what purges rolled up), chunk states and last successes."""
    chunks = defaultdict(dict)
    sql, params = _scrape_pass_over_chunks()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        columns = [column.name for column in cursor.description]
        for row in cursor.fetchall():
            values = dict(zip(columns, row, strict=True))
            policy = values.pop("run__policy")
            chunks[policy] = {key.removeprefix("sum__"): value or 0
                              for key, value in values.items()}
    runs, now = _run_aggregates(Run.objects.all(), now=True)
    states = {
        policy: {key.removeprefix("state_"): values.pop(key) for key in STATE_COUNTS}
        for policy, values in chunks.items()
    }
    return LedgerFigures(_total(chunks, runs, _rolled_up()), states, now["running"],
                         now["last_success"])


def all_sums() -> dict[str, dict[str, int]]:
    """Live ledger rows plus what purges rolled up before deleting."""
    return _total(chunk_sums(Chunk.objects.all()), run_sums(Run.objects.all()), _rolled_up())


def _total(*parts) -> dict[str, dict[str, int]]:
    # rows_changed is derived here, from the totals, so rows deleted before the ledger
    # counted updates (and rolled up since) count too.
    total = defaultdict(lambda: defaultdict(int))
    for part in parts:
        for policy, values in part.items():
            for key, value in values.items():
                total[policy][key] += value
    for values in total.values():
        values["rows_changed"] = values["rows_deleted"] + values["rows_updated"]
    return total


def _chunk_aggregates(chunks: models.QuerySet, expressions: dict) -> dict[str, dict[str, int]]:
    sums = defaultdict(dict)
    for row in _aggregated(chunks, expressions):
        policy = row.pop("run__policy")
        sums[policy] = {key.removeprefix("sum__"): value or 0 for key, value in row.items()}
    return sums


def _aggregated(chunks: models.QuerySet, expressions: dict) -> models.QuerySet:
    # Aliased, since several keys are also field names.
    aliased = {f"sum__{key}": expression for key, expression in expressions.items()}
    return chunks.values("run__policy").annotate(**aliased).order_by()


@lru_cache(maxsize=1)
def _scrape_pass_over_chunks() -> tuple[str, tuple]:
    """The scrape's statement over every chunk, compiled once per process: its forty
    aggregates took 23 ms of CPU to compile at each scrape, as long as running it."""
    query = _aggregated(Chunk.objects.all(), {**CHUNK_SUMS, **STATE_COUNTS}).query
    return query.get_compiler(Chunk.objects.db).as_sql()


def _run_aggregates(runs: models.QuerySet, *, now: bool = False):
    """The runs' counters per policy; with ``now``, also (in the same pass) how many
    are running and when the last completed one finished."""
    sums = defaultdict(lambda: defaultdict(int))
    figures = {"running": defaultdict(int), "last_success": {}}
    extra = {"running": Count("pk", filter=Q(state=Run.State.RUNNING)),
             "finished": Max("finished_at", filter=Q(state=Run.State.COMPLETED))} if now else {}
    rows = runs.values("policy", "trigger").annotate(
        n=Count("pk"), candidates=Sum("candidates"), sent=Sum("messages_sent"), **extra
    ).order_by()
    for row in rows:
        policy = row["policy"]
        sums[policy][f"runs_{row['trigger']}"] += row["n"]
        sums[policy]["candidates_found"] += row["candidates"] or 0
        sums[policy]["chunks_published"] += row["sent"] or 0
        if now:
            figures["running"][policy] += row["running"]
        if row.get("finished"):
            last = figures["last_success"]
            last[policy] = max(last.get(policy, row["finished"]), row["finished"])
    return sums, figures


def roll_up(sums: dict[str, dict[str, int]]) -> None:
    """Add sums of rows about to be purged to LedgerTotal (in the purge's transaction)."""
    for policy, values in sums.items():
        for key, value in values.items():
            if not value:
                continue
            updated = LedgerTotal.objects.filter(policy=policy, key=key).update(
                value=F("value") + Value(value)
            )
            if not updated:
                try:
                    with transaction.atomic():
                        LedgerTotal.objects.create(policy=policy, key=key, value=value)
                except IntegrityError:  # a concurrent purge created it first
                    LedgerTotal.objects.filter(policy=policy, key=key).update(
                        value=F("value") + Value(value)
                    )


def _rolled_up() -> dict[str, dict[str, int]]:
    sums = defaultdict(dict)
    for policy, key, value in LedgerTotal.objects.values_list("policy", "key", "value"):
        sums[policy][key] = value
    return sums
