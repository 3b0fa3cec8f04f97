"""Run the contenders one after another on the same restored data, with renewals racing."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict

from django.conf import settings
from django.db import connection
from django.db.models import Exists, OuterRef
from django.utils import timezone
from django_q.brokers import get_broker

from cleanup.conf import conf
from cleanup.engine import window
from cleanup.models import Chunk, Run
from cleanup.policies import get_policy
from config.devtools.bench import data, targets
from config.devtools.bench.contenders import cluster_ready, contenders
from config.devtools.bench.probes import (
    CLEANED,
    UNTOUCHED,
    MemoryProbe,
    RenewalProbe,
    VacuumProbe,
    function_times,
    function_times_since,
    sample_ids,
    summary,
    track_functions,
    wal_position,
    wal_written,
)
from config.devtools.bench.result import Result
from config.devtools.processes import Cluster, descendants
from reservations.models import Reminder, SeatHold
from reservations.policies import EXPIRE_HOLDS

# Holds each renewal probe draws from.
PROBE_SAMPLE = 5_000


def run_bench(preset: data.Preset, *, timeout: float, say: Callable[[str], None],
              reminders: bool = True, cpu_load: int = 0, only: str | None = None) -> dict:
    """Seed the preset, run every contender on a fresh copy of it, and return the report.

    Each held hold has its reminder, as in the product, unless ``reminders`` is False
    (the engine alone). ``cpu_load`` processes spin on the CPU beside every contender
    (the one DELETE included), from before the idle renewals to the end. ``only``
    "range" runs the one DELETE and the range runs alone.
    """
    policy = get_policy(EXPIRE_HOLDS)
    _forget(policy)
    say(f"Seeding {preset.expired:,} expired among {preset.total:,} holds"
        f"{', with their reminders' if reminders else ', without reminders'}...")
    seeded_at = data.seed_template(
        preset, progress=lambda what, done, total: say(f"  {what}: {done:,}/{total:,}"),
        reminders=reminders,
    )
    cluster = Cluster("bench", os.environ.copy())
    results: list[Result] = []
    tracked = track_functions(True)  # before the queue's processes connect
    cluster.start()
    load = CpuLoad(cpu_load)
    try:
        cluster_ready(timeout)
        load.start()
        if cpu_load:
            say(f"{cpu_load} CPU-bound process{'es' if cpu_load > 1 else ''} running beside.")
        # Measured with the idle cluster polling, as during every contender; the WAL
        # meanwhile is the renewals' and whatever else the server runs.
        wal_from, idle_from = wal_position(), time.perf_counter()
        idle = _idle_renewals(preset.idle_seconds)
        idle_wal = wal_written(wal_from) / (time.perf_counter() - idle_from)
        say(f"Idle renewals: p99 {idle[UNTOUCHED]['p99_ms']} ms (untouched), "
            f"{idle[CLEANED]['p99_ms']} ms (expired).")
        for name, contender in contenders(preset.per_row_sample, only=only).items():
            checkpointed = data.restore(seeded_at)
            say(f"{name}: running...")
            before = function_times() if tracked else None
            result = _measure(contender, policy, timeout, cluster)
            result.name = name
            if before is not None and name.startswith("pipeline"):
                result.functions = function_times_since(before)
            result.checks["checkpoint before the run"] = checkpointed or None
            results.append(result)
            efficiency = (f", time efficiency {result.time_efficiency:.0%}"
                          if result.time_efficiency is not None else "")
            say(f"{name}: {result.rows:,} rows in {result.seconds:.2f} s "
                f"({result.rows_per_second:,.0f} rows/s{efficiency})")
    finally:
        try:
            load.stop()
        finally:
            try:
                cluster.stop()
            finally:
                try:
                    data.drop_template()
                finally:
                    track_functions(False)
    return _report(preset, policy, idle, results) | {
        "idle_wal_bytes_per_second": round(idle_wal), "reminders": reminders,
        "cpu_load": cpu_load, "only": only}


class CpuLoad:
    """Processes that keep a CPU busy each, as another program on the host would."""

    def __init__(self, processes: int):
        self.count = processes
        self.processes: list[subprocess.Popen] = []

    def start(self) -> None:
        # One at a time, so stop() kills those started even if a later one fails.
        for _ in range(self.count):
            self.processes.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))

    def stop(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait()
        self.processes = []


def _measure(contender, policy, timeout: float, cluster: Cluster) -> Result:
    """Run one contender with both renewal probes racing it, then check what it left.

    The cluster's processes' memory is sampled meanwhile: a worker's should not grow
    with the backlog."""
    started_at = timezone.now()
    before = SeatHold.objects.count()
    probes = [RenewalProbe(CLEANED, sample_ids(expired=True, size=PROBE_SAMPLE, seed=1), 1),
              RenewalProbe(UNTOUCHED, sample_ids(expired=False, size=PROBE_SAMPLE, seed=2), 2)]
    vacuums = VacuumProbe([model._meta.db_table for model in data.TABLES])
    memory = MemoryProbe(lambda: descendants(cluster.process.pid))
    for probe in [*probes, vacuums, memory]:
        probe.start()
    # After the restore's CHECKPOINT: each page's first change writes its full image.
    wal_from = wal_position()
    try:
        result = contender(policy, timeout)
        result.wal_bytes = wal_written(wal_from)
    finally:
        vacuumed = vacuums.stop()
        worker_mb = memory.stop()
        for probe in probes:
            probe.stop()
    for probe in [*probes, vacuums, memory]:
        if probe.error is not None:
            raise probe.error
    for probe in probes:
        result.renewals[probe.kind] = summary(probe.latencies)
    result.vacuum_seconds = vacuumed
    if result.chunks and result.name.startswith("pipeline"):
        result.worker_rss_mb = worker_mb
    renewed = set().union(*(probe.renewed for probe in probes))
    result.checks["renewed holds all survived"] = (
        SeatHold.objects.filter(pk__in=renewed).count() == len(renewed)
    )
    result.checks["rows gone match rows reported"] = (
        before - SeatHold.objects.count() == result.rows
    )
    # An anti-join: NOT IN over a million ids would compare each reminder with each.
    result.checks["no reminder outlived its hold"] = not Reminder.objects.filter(
        ~Exists(SeatHold.objects.filter(pk=OuterRef("hold_id")))).exists()
    if not result.extrapolated:
        result.checks["no hold expired at the start is left"] = not policy.eligible_rows(
            policy.freeze(started_at)).exists()
    return result


def _forget(policy) -> None:
    """Start from an empty queue and no runs of the policy: the first runs learn from
    nothing."""
    get_broker().purge_queue()
    Chunk.objects.filter(run__policy=policy.name).delete()
    Run.objects.filter(policy=policy.name).delete()


def _idle_renewals(seconds: float) -> dict:
    probes = [RenewalProbe(CLEANED, sample_ids(expired=True, size=PROBE_SAMPLE, seed=1), 1),
              RenewalProbe(UNTOUCHED, sample_ids(expired=False, size=PROBE_SAMPLE, seed=2), 2)]
    for probe in probes:
        probe.start()
    time.sleep(seconds)
    for probe in probes:
        probe.stop()
    return {probe.kind: summary(probe.latencies) for probe in probes}


def _report(preset, policy, idle: dict, results: list[Result]) -> dict:
    by_name = {result.name: result for result in results}
    one_delete = by_name["single_delete"]
    rows = []
    for result in results:
        row = asdict(result) | {"rows_per_second": round(result.rows_per_second)}
        row["ratio_to_single_delete"] = round(result.rows_per_second
                                              / one_delete.rows_per_second, 4)
        limit = by_name.get(limit_of(result.name))
        row["ratio_to_limit"] = (round(result.rows_per_second / limit.rows_per_second, 4)
                                 if limit else None)
        row["wal_bytes_per_row"] = _rounded(result.wal_bytes_per_row, 1)
        row["wal_per_row_to_single_delete"] = (
            _rounded(result.wal_bytes_per_row / one_delete.wal_bytes_per_row, 4)
            if result.wal_bytes_per_row and one_delete.wal_bytes_per_row else None)
        if result.extrapolated:
            row["extrapolated_seconds"] = round(preset.expired / result.rows_per_second, 1)
        rows.append(row)
    q_cluster = settings.Q_CLUSTER
    report = {
        "preset": asdict(preset),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "postgresql": connection.cursor().connection.info.server_version,
            "broker": "orm" if "orm" in q_cluster else "redis",
            "q_cluster": {key: q_cluster.get(key) for key in ("workers", "poll", "bulk",
                                                              "save_limit", "retry")},
            "starting_chunk_size": policy.chunk_size,
            "chunk_budget_ms": conf.CHUNK_BUDGET_MS,
            "window": window.size(policy),
        },
        "idle_renewals": idle,
        "results": rows,
        # The headline is the first run, on an empty ledger: the run after an outage or
        # on a new install, the one that matters most.
        "ratios": _ratios(by_name),
        "checks_passed": all(ok is not False for r in results for ok in r.checks.values()),
        "finished_at": timezone.now().isoformat(timespec="seconds"),
    }
    return report | {"targets": targets.as_dicts(targets.judge(report))}


RATIOS = {  # name: (contender, reference); the headline, each run to its limit, first
    "range_to_limit": ("pipeline_range_first", "two_connections_range"),
    "range_third_run_to_limit": ("pipeline_range", "two_connections_range"),
    "items_to_limit": ("pipeline_items_first", "two_connections_unnest"),
    "items_second_run_to_limit": ("pipeline_items", "two_connections_unnest"),
    "range_to_single_delete": ("pipeline_range_first", "single_delete"),
    "range_third_run_to_single_delete": ("pipeline_range", "single_delete"),
    "items_to_handwritten_unnest": ("pipeline_items_first", "handwritten_unnest"),
    "items_second_run_to_handwritten_unnest": ("pipeline_items", "handwritten_unnest"),
}
# Each scheme's pipeline runs (by the start of their name) and the limit of two
# connections running its statements with nothing else to do.
LIMITS = {"pipeline_range": "two_connections_range",
          "pipeline_items": "two_connections_unnest"}


def limit_of(name: str) -> str | None:
    """The limit contender a pipeline run is measured against; None for the others."""
    return next((limit for runs, limit in LIMITS.items() if name.startswith(runs)), None)


def _ratios(by_name: dict) -> dict:
    """Each ratio whose two contenders ran (a range-only run has no items ratios)."""
    return {name: round(by_name[contender].rows_per_second
                        / by_name[reference].rows_per_second, 4)
            for name, (contender, reference) in RATIOS.items()
            if contender in by_name and reference in by_name}


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
