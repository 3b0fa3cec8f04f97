"""Prometheus figures read from the ledger at scrape time.

Workers run in other processes and on other hosts than the web process that serves
/metrics, so nothing here is counted in memory: every counter is a sum over the
run and chunk rows (which only ever add), and every gauge a query of the current
state. Any web process on any host therefore serves the same, right figures.
"""

from __future__ import annotations

from collections import defaultdict

from django.db.models import Count, Q, Sum
from django.utils import timezone
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from cleanup.models import Chunk, OrphanMessage, Run
from cleanup.overview import policy_overview
from cleanup.policies import all_policies

DURATION_BUCKETS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)
ROWS_BUCKETS = (0, 1, 10, 50, 100, 250, 500, 1000, 2500, 5000)
UNKNOWN_POLICY = "unknown"

# name, help, the ledger sum behind it
CHUNK_COUNTERS = [
    ("cleanup_deliveries", "Chunk deliveries started.", Sum("deliveries")),
    ("cleanup_rows_deleted", "Rows deleted by chunks.", Sum("rows_deleted")),
    ("cleanup_noop", "Deliveries that changed nothing (duplicates, replays, nothing eligible).",
     Sum("noop_deliveries")),
    ("cleanup_items_skipped",
     "Planned rows no longer eligible when their chunk ran (renewed, confirmed, gone).",
     Sum("items_skipped")),
    ("cleanup_retryable_failures",
     "Transient errors: retries inside a delivery plus deliveries left for redelivery.",
     Sum("transient_retries") + Sum("failures")),
    ("cleanup_chunks_committed", "Chunks whose outcome committed.",
     Count("pk", filter=Q(committed_at__isnull=False))),
]


class LedgerCollector:
    """A prometheus_client collector over the cleanup ledger."""

    def describe(self):
        # Without this, registering the collector would query the database.
        return []

    def collect(self):
        now = timezone.now()
        policies = [p.name for p in all_policies()]
        yield from self._chunk_counters(policies)
        yield from self._run_counters(policies)
        yield from self._histograms(policies)
        yield from self._state_gauges(policies)
        yield from self._health_gauges(now)

    def _chunk_counters(self, policies):
        sums = _per_policy(
            Chunk.objects.values("run__policy").annotate(
                **{name: expr for name, _, expr in CHUNK_COUNTERS},
                dead=Sum("dead_letters"),
            ),
            "run__policy",
        )
        for name, help_text, _ in CHUNK_COUNTERS:
            family = CounterMetricFamily(name, help_text, labels=["policy"])
            for policy in policies:
                family.add_metric([policy], sums[policy].get(name) or 0)
            yield family
        dead = CounterMetricFamily(
            "cleanup_dead_lettered",
            "Chunks dead-lettered; policy 'unknown' counts messages that named no chunk.",
            labels=["policy"],
        )
        for policy in policies:
            dead.add_metric([policy], sums[policy].get("dead") or 0)
        dead.add_metric([UNKNOWN_POLICY], OrphanMessage.objects.count())
        yield dead

    def _run_counters(self, policies):
        runs = CounterMetricFamily("cleanup_runs", "Runs started, by trigger.",
                                   labels=["policy", "trigger"])
        found = CounterMetricFamily(
            "cleanup_candidates_found", "Rows found eligible when runs were planned.",
            labels=["policy"],
        )
        published = CounterMetricFamily(
            "cleanup_chunks_published", "Chunk messages published (first sends and re-sends).",
            labels=["policy"],
        )
        rows = Run.objects.values_list("policy", "trigger").annotate(
            n=Count("pk"), candidates=Sum("candidates"), sent=Sum("messages_sent")
        ).order_by()
        counts, candidates, sent = {}, defaultdict(int), defaultdict(int)
        for policy, trigger, n, found_rows, messages in rows:
            counts[policy, trigger] = n
            candidates[policy] += found_rows or 0
            sent[policy] += messages or 0
        for policy in policies:
            for trigger in Run.Trigger.values:
                runs.add_metric([policy, trigger], counts.get((policy, trigger), 0))
            found.add_metric([policy], candidates[policy])
            published.add_metric([policy], sent[policy])
        yield runs
        yield found
        yield published

    def _histograms(self, policies):
        committed = Chunk.objects.filter(committed_at__isnull=False)
        duration = _per_policy(
            committed.filter(duration_ms__isnull=False).values("run__policy").annotate(
                count=Count("pk"), total=Sum("duration_ms"),
                **{f"le{b}": Count("pk", filter=Q(duration_ms__lte=b))
                   for b in DURATION_BUCKETS_MS},
            ),
            "run__policy",
        )
        sizes = _per_policy(
            committed.values("run__policy").annotate(
                count=Count("pk"), total=Sum("rows_deleted"),
                **{f"le{b}": Count("pk", filter=Q(rows_deleted__lte=b)) for b in ROWS_BUCKETS},
            ),
            "run__policy",
        )
        yield _histogram(
            "cleanup_chunk_transaction_seconds",
            "Duration of the transaction that committed each chunk (up to its last write).",
            duration, DURATION_BUCKETS_MS, policies, scale=1000,
        )
        yield _histogram("cleanup_chunk_rows", "Rows deleted per committed chunk.", sizes,
                         ROWS_BUCKETS, policies)

    def _state_gauges(self, policies):
        family = GaugeMetricFamily("cleanup_chunks", "Chunks by current state.",
                                   labels=["policy", "state"])
        counts = {
            (policy, state): n
            for policy, state, n in Chunk.objects.values_list("run__policy", "state")
            .annotate(n=Count("pk")).order_by()
        }
        for policy in policies:
            for state in Chunk.State.values:
                family.add_metric([policy, state], counts.get((policy, state), 0))
        yield family

    def _health_gauges(self, now):
        gauges = {
            "eligible": GaugeMetricFamily(
                "cleanup_eligible_rows",
                "Rows eligible now: the backlog. A PostgreSQL planner estimate, not a count.",
                labels=["policy"]),
            "oldest": GaugeMetricFamily(
                "cleanup_oldest_eligible_age_seconds",
                "How long the oldest row eligible now has been eligible (0 when none).",
                labels=["policy"]),
            "unfinished": GaugeMetricFamily(
                "cleanup_oldest_unfinished_chunk_age_seconds",
                "Age of the oldest planned, enqueued or retrying chunk (0 when none).",
                labels=["policy"]),
            "stalled": GaugeMetricFamily(
                "cleanup_stalled_chunks",
                "Unfinished chunks with no delivery activity for longer than the lease.",
                labels=["policy"]),
            "ack": GaugeMetricFamily(
                "cleanup_chunks_awaiting_ack", "Chunks committed but not acknowledged.",
                labels=["policy"]),
            "lag": GaugeMetricFamily(
                "cleanup_schedule_lag_seconds",
                "Seconds since the newest due schedule slot that has no run (0 when on time).",
                labels=["policy"]),
            "success": GaugeMetricFamily(
                "cleanup_last_success_timestamp_seconds",
                "Unix time the last run that completed without dead letters finished.",
                labels=["policy"]),
        }
        for policy in all_policies():
            view = policy_overview(policy, now, exact=False)
            label = [policy.name]
            gauges["eligible"].add_metric(label, view.eligible_rows)
            gauges["oldest"].add_metric(label, _seconds(view.oldest_eligible_age))
            gauges["unfinished"].add_metric(label, _seconds(view.oldest_unfinished_age))
            gauges["stalled"].add_metric(label, view.stalled_chunks)
            gauges["ack"].add_metric(label, view.awaiting_ack)
            gauges["lag"].add_metric(label, view.schedule.lag.total_seconds())
            if view.last_success is not None:
                gauges["success"].add_metric(label, view.last_success.finished_at.timestamp())
        yield from gauges.values()


_collector = LedgerCollector()


def register_collector() -> None:
    """Add the ledger collector to prometheus_client's default registry, once."""
    from prometheus_client import REGISTRY

    if _collector not in REGISTRY._collector_to_names:
        REGISTRY.register(_collector)


def ledger_collector() -> LedgerCollector:
    return _collector


def _per_policy(rows, key: str) -> dict:
    result = defaultdict(dict)
    for row in rows:
        result[row.pop(key)] = row
    return result


def _histogram(name, help_text, data, buckets, policies, scale=1):
    family = HistogramMetricFamily(name, help_text, labels=["policy"])
    for policy in policies:
        row = data.get(policy, {})
        cumulative = [(str(b / scale), row.get(f"le{b}", 0)) for b in buckets]
        cumulative.append(("+Inf", row.get("count", 0)))
        family.add_metric([policy], cumulative, (row.get("total") or 0) / scale)
    return family


def _seconds(age) -> float:
    return age.total_seconds() if age is not None else 0.0
