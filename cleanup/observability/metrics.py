"""Prometheus figures read from the ledger at scrape time.

Workers run in other processes and on other hosts than the web process that serves
/metrics, so nothing here is counted in memory: every counter and gauge is read from the
database. Any web process on any host therefore serves the same, right figures.

A scrape reads the ledger's totals, one row per policy, which the database adds to as
each change commits (cleanup.observability.counters), and each policy's health as the
console's overview
reads it (cleanup.observability.overview: the unfinished chunks through the state
index, each policy's backlog through its own index, counted up to a cap), its backlog
within the scrape's 40 ms a statement: p95 0.27 s while a run deletes a million rows
beside a retention's worth of ledger (docs/performance.md, Measured).
"""

from __future__ import annotations

import math

from django.db import connection
from django.utils import timezone
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    SummaryMetricFamily,
)

from cleanup.conf import conf
from cleanup.engine import pressure, steps
from cleanup.models import Chunk, Halt, OrphanMessage, Run
from cleanup.observability import health
from cleanup.observability.backlog import COUNT_CAP, Budget
from cleanup.observability.counters import (
    DURATION_BUCKETS_MS,
    ROWS_BUCKETS,
    WAL_COUNTED_FROM,
    ledger_figures,
)
from cleanup.observability.events import event_families
from cleanup.observability.overview import backlog_age_limit, overview
from cleanup.policies import all_policies

UNKNOWN_POLICY = "unknown"
# How much of a failing halt's cause its label carries.
FAILING_CAUSE_SHOWN = 120

# family name, help text, key in the counter sums
COUNTERS = [
    ("cleanup_candidates_found", "Rows found eligible when runs were planned.",
     "candidates_found"),
    ("cleanup_chunks_published", "Chunk messages published (first sends and re-sends).",
     "messages_sent"),
    ("cleanup_deliveries", "Chunk deliveries started.", "deliveries"),
    ("cleanup_rows_deleted", "Rows deleted by chunks.", "rows_deleted"),
    ("cleanup_rows_updated", "Rows updated by the chunks of update policies.", "rows_updated"),
    ("cleanup_rows_changed", "Rows changed by chunks: deleted, or updated.", "rows_changed"),
    ("cleanup_noop", "Deliveries that changed nothing (duplicates, replays, nothing eligible).",
     "noop_deliveries"),
    ("cleanup_items_skipped",
     "Planned rows no longer eligible when their chunk ran (renewed, confirmed, gone).",
     "items_skipped"),
    ("cleanup_rows_locked",
     "Eligible rows a chunk skipped because another transaction kept them locked past "
     "CLEANUP_ROW_LOCK_WAIT_MS; a later pass takes them.", "rows_locked"),
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
        figures = ledger_figures()
        yield from self._counters(policies, figures.sums)
        yield from self._histograms(policies, figures.sums)
        yield self._state_gauges(policies, figures.states)
        yield self._running(policies, figures.running)
        yield from self._health_gauges(now)
        yield self._heartbeats()
        yield self._blocked_steps()
        yield from self._holds(now)
        yield from event_families(now)

    def _holds(self, now):
        """Halts in force and the time spent halted, per policy and reason (the ledger of
        halts is small: a pause is an operator's act)."""
        halted = GaugeMetricFamily("cleanup_policy_held",
                                 "1 while the policy is halted (paused): it plans nothing new.",
                                 labels=["policy", "reason"])
        seconds = CounterMetricFamily("cleanup_held_seconds",
                                      "Seconds the policy has spent halted, per reason.",
                                      labels=["policy", "reason"])
        failing = GaugeMetricFamily(
            "cleanup_policy_failing",
            "Dead letters among a policy's last CLEANUP_FAILING_CHUNKS chunks, while they halt "
            "its policy (reason failing) until an operator resumes it; cause: the most "
            "common.", labels=["policy", "cause"])
        spent = {}
        for halt in Halt.objects.only("policy", "reason", "began_at", "ended_at", "cause",
                                      "value"):
            key = (halt.policy, halt.reason)
            spent[key] = spent.get(key, 0.0) + _age(halt.ended_at or now, halt.began_at)
            if halt.ended_at is None:
                halted.add_metric(list(key), 1)
                if halt.reason == Halt.FAILING:
                    failing.add_metric([halt.policy, halt.cause[:FAILING_CAUSE_SHOWN]],
                                       halt.value or 0)
        for key, total in sorted(spent.items()):
            seconds.add_metric(list(key), total)
        yield halted
        yield seconds
        yield failing
        lag = GaugeMetricFamily(
            "cleanup_replica_lag_seconds",
            "Replay lag of the most lagging streaming standby, read on the primary from "
            "pg_stat_replication (0 with none, or all caught up).")
        lag.add_metric([], pressure.replica_lag(None, connection).value or 0.0)
        yield lag

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
        yield self._wal(policies, sums)

    def _wal(self, policies, sums):
        """Where the server counts WAL for each session (PostgreSQL 18); before that, the
        family has no sample: unknown, not 0 (cleanup/sql/wal_v1.sql)."""
        family = SummaryMetricFamily(
            "cleanup_chunk_wal_bytes",
            "WAL written by the transaction that committed each chunk, over the chunks "
            "measured (_count). No sample on PostgreSQL before 18, which keeps no "
            "per-session WAL counters.", labels=["policy"])
        if connection.pg_version >= WAL_COUNTED_FROM:
            for policy in policies:
                family.add_metric([policy], sums[policy]["wal_chunks"],
                                  sums[policy]["wal_bytes"])
        return family

    def _state_gauges(self, policies, states):
        family = GaugeMetricFamily("cleanup_chunks", "Chunks by current state.",
                                   labels=["policy", "state"])
        for policy in policies:
            for state in Chunk.State.values:
                family.add_metric([policy, state], states.get(policy, {}).get(state, 0))
        return family

    def _running(self, policies, running):
        family = GaugeMetricFamily("cleanup_runs_running",
                                   "Runs started and not finished yet (running).",
                                   labels=["policy"])
        for policy in policies:
            family.add_metric([policy], running.get(policy, 0))
        return family

    def _health_gauges(self, now):
        gauges = {
            "eligible": GaugeMetricFamily(
                "cleanup_eligible_rows",
                f"Rows eligible now: the backlog, counted exactly up to {COUNT_CAP} (at the "
                "cap: at least that many). No sample while it cannot be measured.",
                labels=["policy"]),
            "oldest": GaugeMetricFamily(
                "cleanup_oldest_eligible_age_seconds",
                "How long the oldest row eligible now has been eligible (0 when none). No "
                "sample while it cannot be measured.",
                labels=["policy"]),
            "exact": GaugeMetricFamily(
                "cleanup_backlog_exact",
                "1 when the eligible rows and oldest age were read exactly now; 0 when "
                "reading them ran out of the budget: they then repeat the last exact "
                "reading any process took (its age grown since), raised to any lower bound "
                "read now (rows counted, chunks in flight), and have no sample if there is "
                "neither.",
                labels=["policy"]),
            "reading_age": GaugeMetricFamily(
                "cleanup_backlog_reading_age_seconds",
                "Seconds since the exact reading the eligible rows and oldest age come "
                "from was taken: 0 when now; no sample when they are only a lower bound.",
                labels=["policy"]),
            "unfinished": GaugeMetricFamily(
                "cleanup_oldest_unfinished_chunk_age_seconds",
                "Age of the oldest planned, enqueued or retrying chunk (0 when none).",
                labels=["policy"]),
            "stalled": GaugeMetricFamily(
                "cleanup_stalled_chunks",
                "Chunks unfinished for longer than the redelivery window since they were sent "
                "(whatever deliveries were attempted).",
                labels=["policy"]),
            "undispatched": GaugeMetricFamily(
                "cleanup_undispatched_slots",
                "Schedule slots the scheduler fired longer than the redelivery window ago that no "
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
                "schedule periods plus the redelivery window.",
                labels=["policy"]),
            "success": GaugeMetricFamily(
                "cleanup_last_success_timestamp_seconds",
                "Unix time the last run that completed without dead letters finished.",
                labels=["policy"]),
        }
        for policy in overview(now, Budget()):
            label, reading, schedule = [policy.policy], policy.backlog, policy.schedule
            gauges["exact"].add_metric(label, 1 if reading and reading.exact else 0)
            # Nothing measured: no sample, which the alert rule rides over; a 0 would say
            # "no backlog" and reset its for:.
            if reading is not None:
                gauges["eligible"].add_metric(label, reading.rows)
                gauges["oldest"].add_metric(label, _age(now, policy.backlog_since))
                if reading.read_at is not None:
                    gauges["reading_age"].add_metric(label, _age(now, reading.read_at))
            gauges["unfinished"].add_metric(label, _age(now, policy.oldest_unfinished_since))
            gauges["stalled"].add_metric(label, policy.stalled_chunks)
            gauges["ack"].add_metric(label, policy.awaiting_ack)
            gauges["undispatched"].add_metric(label, schedule.undispatched)
            if schedule.installed:
                gauges["lag"].add_metric(label, schedule.lag.total_seconds())
                gauges["grace"].add_metric(label, conf.SCHEDULE_GRACE_SECONDS)
                gauges["limit"].add_metric(label, backlog_age_limit(schedule).total_seconds())
            if policy.last_success is not None:
                gauges["success"].add_metric(label, policy.last_success.finished_at.timestamp())
        yield from gauges.values()

    def _heartbeats(self):
        family = GaugeMetricFamily(
            "cleanup_heartbeat_age_seconds",
            "Seconds since a worker of each cluster last ran the heartbeat task, by the "
            "database's clock (a cluster that stopped taking work grows; an idle one does "
            "not); +Inf for a cluster that said it stopped and for a beat stamped in the "
            "future, which proves nothing.",
            labels=["host", "cluster"])
        for beat in health.heartbeats():
            age = (math.inf if beat.from_the_future or beat.stopped_at
                   else max(beat.age.total_seconds(), 0.0))
            family.add_metric([beat.host, beat.cluster], age)
        return family


    def _blocked_steps(self):
        family = GaugeMetricFamily(
            "cleanup_step_blocked_seconds",
            "Seconds since a step (a policy's dispatch, the reconciler, the publisher, a "
            "host's task) first gave up on a lock held past CLEANUP_LOCK_TIMEOUT_MS, while "
            "it has not got through since, by the database's clock; blocker is the "
            "session found holding the lock (its application and pid).",
            labels=["step", "policy", "blocker"])
        for blocked in steps.blocked_now():
            family.add_metric([blocked.step, blocked.policy, blocked.blocker],
                              max(blocked.age.total_seconds(), 0.0))
        return family


_collector = LedgerCollector()


def register_collector() -> None:
    """Add the ledger collector to prometheus_client's default registry, once."""
    from prometheus_client import REGISTRY

    if _collector not in REGISTRY._collector_to_names:
        REGISTRY.register(_collector)


def ledger_collector() -> LedgerCollector:
    return _collector


def _age(now, since) -> float:
    return max((now - since).total_seconds(), 0.0) if since is not None else 0.0
