"""The ledger's counters, summed per policy: what /metrics reports as *_total.

The same sums are taken over the rows a retention purge is about to delete and
added to LedgerTotal first, so purging the ledger never makes a counter go down.

A scrape would otherwise read every chunk the ledger keeps (0.16 s for the 136,000
chunks of a retention's worth of runs, and growing with it). So chunks of runs that
finished a while ago are folded: their counters and their state move into
LedgerTotal once, and the scrape's pass reads only the chunks not folded, through a
partial index. A folded chunk that changes again (a replay, a requeue, a purge)
unfolds first: a database trigger takes what it had added back out of LedgerTotal, in
the changing statement's own transaction, so every figure stays what a pass over all
the rows would say. The trigger's statement is compiled from the same aggregates as
the scrape's (``unfold_trigger_sql``); a test pins the installed one to it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache

from django.db import IntegrityError, connection, models, transaction
from django.db.models import Count, F, OuterRef, Q, Subquery, Sum, Value
from django.db.models.lookups import LessThanOrEqual
from django.utils import timezone

from cleanup.engine import transitions
from cleanup.models import ROWS_CHANGED, Chunk, LedgerTotal, Run, rows_changed

DURATION_BUCKETS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)
ROWS_BUCKETS = (0, 1, 10, 50, 100, 250, 500, 1000, 2500, 5000)

_committed = Q(committed_at__isnull=False)
_timed = _committed & Q(duration_ms__isnull=False)

CHUNK_SUMS = {
    "deliveries": Sum("deliveries"),
    "rows_deleted": Sum("rows_deleted"),
    "rows_updated": Sum("rows_updated"),
    "noop_deliveries": Sum("noop_deliveries"),
    "items_skipped": Sum("items_skipped"),
    "rows_locked": Sum("rows_locked"),
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
STATE_PREFIX = "state_"
POLICY = "chunk_policy"  # the name of the policy column in the chunk sums' rows

# Chunks of a run finished this long ago are folded into LedgerTotal, so many at a
# time, one transaction each.
FOLD_AFTER = timedelta(minutes=10)
FOLD_BATCH = 5_000
# Stands for the trigger's OLD.id while its statement is compiled.
_OLD_ID = "-7346112905"


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


def ledger_figures() -> LedgerFigures:
    """Counters (live rows plus what purges rolled up), chunk states and runs running."""
    chunks = defaultdict(dict)
    sql, params = _scrape_pass_over_chunks()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        columns = [column.name for column in cursor.description]
        for row in cursor.fetchall():
            values = dict(zip(columns, row, strict=True))
            policy = values.pop(POLICY)
            chunks[policy] = {key.removeprefix("sum__"): value or 0
                              for key, value in values.items()}
    runs, now = _run_aggregates(Run.objects.all(), now=True)
    rolled_up, folded_states = _rolled_up()
    states = defaultdict(lambda: defaultdict(int))
    for part in (_split_states(chunks), folded_states):
        for policy, values in part.items():
            for state, count in values.items():
                states[policy][state] += count
    return LedgerFigures(_total(chunks, runs, rolled_up), states, now["running"])


def _split_states(sums: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Take the ``state_*`` keys out of each policy's sums, as chunks per state."""
    return {policy: {key.removeprefix(STATE_PREFIX): values.pop(key)
                     for key in [k for k in values if k.startswith(STATE_PREFIX)]}
            for policy, values in sums.items()}


def _total(*parts) -> dict[str, dict[str, int]]:
    # rows_changed is derived here, from the totals, so rows deleted before the ledger
    # counted updates (and rolled up since) count too.
    total = defaultdict(lambda: defaultdict(int))
    for part in parts:
        for policy, values in part.items():
            for key, value in values.items():
                total[policy][key] += value
    for values in total.values():
        values["rows_changed"] = rows_changed(values)
    return total


def _chunk_aggregates(chunks: models.QuerySet, expressions: dict) -> dict[str, dict[str, int]]:
    sums = defaultdict(dict)
    for row in _aggregated(chunks, expressions):
        policy = row.pop(POLICY)
        sums[policy] = {key.removeprefix("sum__"): value or 0 for key, value in row.items()}
    return sums


def _aggregated(chunks: models.QuerySet, expressions: dict) -> models.QuerySet:
    # Aliased, since several keys are also field names. The policy is looked up per
    # chunk by the run's key: a join let the planner hash every run the ledger keeps
    # (30 ms for 100,000) to count a few hundred chunks.
    aliased = {f"sum__{key}": expression for key, expression in expressions.items()}
    policy = Subquery(Run.objects.filter(pk=OuterRef("run_id")).order_by().values("policy")[:1])
    return (chunks.annotate(**{POLICY: policy}).values(POLICY).annotate(**aliased)
            .order_by())


@lru_cache(maxsize=1)
def _scrape_pass_over_chunks() -> tuple[str, tuple]:
    """The scrape's statement over every chunk, compiled once per process: its forty
    aggregates took 23 ms of CPU to compile at each scrape, as long as running it."""
    query = _aggregated(Chunk.objects.filter(folded=False), {**CHUNK_SUMS, **STATE_COUNTS}).query
    return query.get_compiler(Chunk.objects.db).as_sql()


def _run_aggregates(runs: models.QuerySet, *, now: bool = False):
    """The runs' counters per policy; with ``now``, also (in the same pass) how many
    are running."""
    sums = defaultdict(lambda: defaultdict(int))
    figures = {"running": defaultdict(int)}
    extra = {"running": Count("pk", filter=Q(state=Run.State.RUNNING))} if now else {}
    rows = runs.values("policy", "trigger").annotate(
        n=Count("pk"), candidates=Sum("candidates"), sent=Sum("messages_sent"), **extra
    ).order_by()
    for row in rows:
        policy = row["policy"]
        sums[policy][f"runs_{row['trigger']}"] += row["n"]
        sums[policy]["candidates_found"] += row["candidates"] or 0
        sums[policy]["messages_sent"] += row["sent"] or 0
        if now:
            figures["running"][policy] += row["running"]
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


def _rolled_up() -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
    """LedgerTotal's counters per policy, and apart from them its folded chunks per state."""
    sums = defaultdict(dict)
    for policy, key, value in LedgerTotal.objects.values_list("policy", "key", "value"):
        sums[policy][key] = value
    return sums, _split_states(sums)


def fold(now: datetime | None = None, batch: int = FOLD_BATCH) -> int:
    """Fold the finished chunks of runs that finished ``FOLD_AFTER`` ago into
    LedgerTotal, ``batch`` at a time; returns how many were folded.

    Each batch is locked, summed, added and marked in one transaction, so no figure
    is counted twice or lost; a chunk another transaction holds waits for a later fold.
    """
    settled_before = (now or timezone.now()) - FOLD_AFTER
    folded = 0
    while True:
        with transaction.atomic():
            ids = list(
                Chunk.objects.filter(folded=False, state__in=Chunk.FINISHED,
                                     run__state__in=Run.FINISHED,
                                     run__finished_at__lt=settled_before)
                .select_for_update(of=("self",), skip_locked=True)
                .order_by().values_list("pk", flat=True)[:batch]
            )
            if not ids:
                return folded
            chunks = Chunk.objects.filter(pk__in=ids)
            roll_up(_chunk_aggregates(chunks, {**CHUNK_SUMS, **STATE_COUNTS}))
            transitions.to_folded(ids)
        folded += len(ids)


def install_unfold_trigger(schema_editor) -> None:
    """Create (or replace) the unfolding trigger; migrations call this."""
    schema_editor.execute(unfold_trigger_sql(), params=None)


def unfold_trigger_sql() -> str:
    """The function and trigger that unfold a folded chunk before it changes or goes.

    Before an UPDATE, it takes the chunk's counters and state out of LedgerTotal (the
    row is counted live again, with its new values); before a DELETE only its state
    (its counters stay counted, as a purge's roll-up would have kept them).
    """
    one = Chunk.objects.filter(pk=int(_OLD_ID))
    query = _aggregated(one, {**CHUNK_SUMS, **STATE_COUNTS}).query
    one_sql, one_params = query.get_compiler(Chunk.objects.db).as_sql()
    with connection.cursor() as cursor:
        one_chunk = cursor.mogrify(one_sql, one_params).replace(_OLD_ID, "OLD.id")
    totals_table = LedgerTotal._meta.db_table
    chunk_table = Chunk._meta.db_table
    return f"""
CREATE OR REPLACE FUNCTION cleanup_chunk_unfold() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
    INSERT INTO "{totals_table}" ("policy", "key", "value")
    SELECT counted."{POLICY}", substr(figure.key, 6), -figure.value::bigint
    FROM ({one_chunk}) AS counted, jsonb_each_text(to_jsonb(counted) - '{POLICY}') AS figure
    WHERE figure.value IS NOT NULL AND figure.value::bigint <> 0
      AND (TG_OP = 'UPDATE' OR left(figure.key, 11) = 'sum__{STATE_PREFIX}')
    ON CONFLICT ("policy", "key")
      DO UPDATE SET "value" = "{totals_table}"."value" + EXCLUDED."value";
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    NEW.folded := false;
    RETURN NEW;
END
$body$;
DROP TRIGGER IF EXISTS cleanup_chunk_unfold ON "{chunk_table}";
CREATE TRIGGER cleanup_chunk_unfold BEFORE UPDATE OR DELETE ON "{chunk_table}"
    FOR EACH ROW WHEN (OLD.folded) EXECUTE FUNCTION cleanup_chunk_unfold();
"""

