"""The ledger's counters, summed per policy: what /metrics reports as *_total.

The same sums are taken over the rows a retention purge is about to delete and
added to LedgerTotal first, so purging the ledger never makes a counter go down.
"""

from __future__ import annotations

from collections import defaultdict

from django.db import IntegrityError, models, transaction
from django.db.models import Count, F, Q, Sum, Value
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


def chunk_sums(chunks: models.QuerySet) -> dict[str, dict[str, int]]:
    # Aliased, since several keys are also field names.
    aliased = {f"sum__{key}": expression for key, expression in CHUNK_SUMS.items()}
    sums = defaultdict(dict)
    for row in chunks.values("run__policy").annotate(**aliased).order_by():
        policy = row.pop("run__policy")
        sums[policy] = {key.removeprefix("sum__"): value or 0 for key, value in row.items()}
    return sums


def run_sums(runs: models.QuerySet) -> dict[str, dict[str, int]]:
    sums = defaultdict(lambda: defaultdict(int))
    rows = runs.values_list("policy", "trigger").annotate(
        n=Count("pk"), candidates=Sum("candidates"), sent=Sum("messages_sent")
    ).order_by()
    for policy, trigger, n, candidates, sent in rows:
        sums[policy][f"runs_{trigger}"] += n
        sums[policy]["candidates_found"] += candidates or 0
        sums[policy]["chunks_published"] += sent or 0
    return sums


def all_sums() -> dict[str, dict[str, int]]:
    """Live ledger rows plus what purges rolled up before deleting.

    ``rows_changed`` is derived here, from the totals, so rows deleted before the
    ledger counted updates (and rolled up since) count too.
    """
    total = defaultdict(lambda: defaultdict(int))
    for part in (chunk_sums(Chunk.objects.all()), run_sums(Run.objects.all()), _rolled_up()):
        for policy, values in part.items():
            for key, value in values.items():
                total[policy][key] += value
    for values in total.values():
        values["rows_changed"] = values["rows_deleted"] + values["rows_updated"]
    return total


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
