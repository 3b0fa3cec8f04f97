"""Prometheus figures read from the ledger at scrape time.

Workers run in other processes and on other hosts than the web process that serves
/metrics, so nothing here is counted in memory: every counter is a sum over the
run and chunk rows (which only ever add), and every gauge a query of the current
state. Any web process on any host therefore serves the same, right figures.
"""

from __future__ import annotations

from django.db.models import Count
from django.utils import timezone
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from cleanup.conf import conf
from cleanup.counters import DURATION_BUCKETS_MS, ROWS_BUCKETS, all_sums
from cleanup.models import Chunk, OrphanMessage, Run, WorkerHeartbeat
from cleanup.overview import backlog_age_limit, policy_overview
from cleanup.policies import all_policies

UNKNOWN_POLICY = "unknown"

# family name, help text, key in the counter sums
COUNTERS = [
    ("cleanup_candidates_found", "Rows found eligible when runs were planned.",
     "candidates_found"),
    ("cleanup_chunks_published", "Chunk messages published (first sends and re-sends).",
     "chunks_published"),
    ("cleanup_deliveries", "Chunk deliveries started.", "deliveries"),
    ("cleanup_rows_deleted", "Rows deleted by chunks.", "rows_deleted"),
    ("cleanup_rows_updated", "Rows updated by the chunks of update policies.", "rows_updated"),
    ("cleanup_rows_changed", "Rows changed by chunks: deleted, or updated.", "rows_changed"),
    ("cleanup_noop", "Deliveries that changed nothing (duplicates, replays, nothing eligible).",
     "noop"),
    ("cleanup_items_skipped",
     "Planned rows no longer eligible when their chunk ran (renewed, confirmed, gone).",
     "items_skipped"),
    ("cleanup_retryable_failures",
     "Transient errors: retries inside a delivery plus deliveries left for redelivery.",
     "retryable_failures"),
    ("cleanup_chunks_committed", "Chunks whose outcome committed.", "chunks_committed"),
    ("cleanup_chunks_reconciled", "Chunks re-sent by the reconciler (lost or unsent).",
     "reconciled"),
]


class LedgerCollector:
    """A prometheus_client collector over the cleanup ledger."""

    def describe(self):
        # Without this, registering the collector would query the database.
        return []

    def collect(self):
        now = timezone.now()
        policies = [p.name for p in all_policies()]
        sums = all_sums()
        yield from self._counters(policies, sums)
        yield from self._histograms(policies, sums)
        yield from self._state_gauges(policies)
        yield from self._health_gauges(now)
        yield self._heartbeats(now)

    def _counters(self, policies, sums):
        for name, help_text, key in COUNTERS:
            family = CounterMetricFamily(name, help_text, labels=["policy"])
            for policy in policies:
                family.add_metric([policy], sums[policy][key])
            yield family
        dead = CounterMetricFamily(
            "cleanup_dead_lettered",
            "Chunks dead-lettered; policy 'unknown' counts messages that named no chunk.",
            labels=["policy"],
        )
        for policy in policies:
            dead.add_metric([policy], sums[policy]["dead_lettered"])
        dead.add_metric([UNKNOWN_POLICY], OrphanMessage.objects.count())
        yield dead
        runs = CounterMetricFamily("cleanup_runs", "Runs started, by trigger.",
                                   labels=["policy", "trigger"])
        for policy in policies:
            for trigger in Run.Trigger.values:
                runs.add_metric([policy, trigger], sums[policy][f"runs_{trigger}"])
        yield runs

    def _histograms(self, policies, sums):
        duration = HistogramMetricFamily(
            "cleanup_chunk_transaction_seconds",
            "Duration of the transaction that committed each chunk (up to its last write).",
            labels=["policy"])
        rows = HistogramMetricFamily("cleanup_chunk_rows",
                                     "Rows changed (deleted or updated) per committed chunk.",
                                     labels=["policy"])
        for policy in policies:
            values = sums[policy]
            duration.add_metric(
                [policy],
                [(str(b / 1000), values[f"duration_le_{b}"]) for b in DURATION_BUCKETS_MS]
                + [("+Inf", values["duration_count"])],
                values["duration_sum_ms"] / 1000,
            )
            rows.add_metric(
                [policy],
                [(str(float(b)), values[f"rows_le_{b}"]) for b in ROWS_BUCKETS]
                + [("+Inf", values["rows_count"])],
                values["rows_sum"],
            )
        yield duration
        yield rows

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
                "Chunks unfinished for longer than the lease since they were sent "
                "(whatever deliveries were attempted).",
                labels=["policy"]),
            "undispatched": GaugeMetricFamily(
                "cleanup_undispatched_slots",
                "Schedule slots the scheduler fired longer than the lease ago that no "
                "worker has dispatched (stalled work, not a missed schedule).",
                labels=["policy"]),
            "ack": GaugeMetricFamily(
                "cleanup_chunks_awaiting_ack", "Chunks committed but not acknowledged.",
                labels=["policy"]),
            "lag": GaugeMetricFamily(
                "cleanup_schedule_lag_seconds",
                "Seconds since the first slot after the scheduler's last firing (or the "
                "schedule's installation) fell due; 0 while the scheduler is on time. "
                "Grows for as long as the scheduler fires nothing.",
                labels=["policy"]),
            "grace": GaugeMetricFamily(
                "cleanup_schedule_grace_seconds",
                "Schedule lag past which a slot counts as missed (CLEANUP_SCHEDULE_GRACE_SECONDS).",
                labels=["policy"]),
            "limit": GaugeMetricFamily(
                "cleanup_backlog_age_limit_seconds",
                "Oldest-eligible age past which the policy's backlog is too old: two "
                "schedule periods plus the lease.",
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
            gauges["undispatched"].add_metric(label, view.schedule.undispatched)
            if view.schedule.installed:
                gauges["lag"].add_metric(label, view.schedule.lag.total_seconds())
                gauges["grace"].add_metric(label, conf.SCHEDULE_GRACE_SECONDS)
                gauges["limit"].add_metric(label, backlog_age_limit(view.schedule).total_seconds())
            if view.last_success is not None:
                gauges["success"].add_metric(label, view.last_success.finished_at.timestamp())
        yield from gauges.values()


    def _heartbeats(self, now):
        family = GaugeMetricFamily(
            "cleanup_heartbeat_age_seconds",
            "Seconds since a worker of each cluster last ran the heartbeat task "
            "(a cluster that stopped taking work grows; an idle one does not).",
            labels=["host", "cluster"])
        for heartbeat in WorkerHeartbeat.objects.all():
            family.add_metric([heartbeat.host, heartbeat.cluster],
                              (now - heartbeat.beat_at).total_seconds())
        return family



_collector = LedgerCollector()


def register_collector() -> None:
    """Add the ledger collector to prometheus_client's default registry, once."""
    from prometheus_client import REGISTRY

    if _collector not in REGISTRY._collector_to_names:
        REGISTRY.register(_collector)


def ledger_collector() -> LedgerCollector:
    return _collector


def _seconds(age) -> float:
    return age.total_seconds() if age is not None else 0.0
