"""The ways of expiring the same holds that the benchmark puts side by side."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.db import connection, transaction
from django.db.models import Max, Min
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_q.brokers import get_broker
from django_q.models import Task
from django_q.tasks import async_task

from cleanup.expressions import array_literal
from cleanup.models import Chunk, Run
from cleanup.policies import ITEMS, RANGE, Policy
from config.devtools import MANAGE
from config.devtools.bench import efficiency
from config.devtools.bench.probes import memory_kb, percentile
from reservations.models import SeatHold

SETTLED = (Chunk.State.ACKNOWLEDGED, Chunk.State.DEAD_LETTERED)


@dataclass
class Result:
    name: str
    label: str
    rows: int
    seconds: float
    extrapolated: bool = False
    chunks: int | None = None
    chunk_size: int | None = None  # a pipeline's: the size its run reached
    first_chunk_size: int | None = None
    window: int | None = None
    chunk_p99_ms: float | None = None
    chunk_max_ms: float | None = None
    dispatch_seconds: float | None = None
    dispatcher_rss_mb: float | None = None
    # The largest resident memory of any of the queue's processes during a pipeline run.
    worker_rss_mb: float | None = None
    dispatch_ms_per_chunk: float | None = None
    # Where a pipeline run's wall time went: until its first chunk started, and the
    # chunks' transactions summed over the workers.
    first_chunk_after_s: float | None = None
    command_to_first_chunk_s: float | None = None
    in_transactions_s: float | None = None
    delete_statements: int | None = None
    # The share of the wall time a chunk statement was executing, and where each
    # chunk's time went (config.devtools.bench.efficiency).
    time_efficiency: float | None = None
    per_chunk_ms: dict | None = None
    renewals: dict = field(default_factory=dict)
    # Seconds a vacuum worked on each table during the contender (probes.VacuumProbe).
    vacuum_seconds: dict = field(default_factory=dict)
    checks: dict = field(default_factory=dict)

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0


def single_delete(policy: Policy, timeout: float) -> Result:
    """One set-based DELETE of everything eligible: the physical limit, one transaction."""
    cutoff = timezone.now()
    with CaptureQueriesContext(connection) as captured:
        started = time.perf_counter()
        with transaction.atomic():
            deleted, _ = policy.eligible_rows(policy.freeze(cutoff)).delete()
        seconds = time.perf_counter() - started
    sent = [q["sql"] for q in captured.captured_queries if q["sql"] not in ("BEGIN", "COMMIT")]
    statements = sum(sql.startswith("DELETE") for sql in sent)
    return Result("single_delete", "One DELETE", deleted, seconds, chunks=1,
                  chunk_p99_ms=seconds * 1000, chunk_max_ms=seconds * 1000,
                  delete_statements=statements,
                  checks={"one DELETE statement": statements == len(sent) == 1})


def pipeline(scheme: str, label: str):
    def contender(policy: Policy, timeout: float) -> Result:
        command_started = timezone.now()
        dispatched, rss_mb = _dispatch_in_subprocess(policy, scheme)
        runs = Run.objects.filter(pk=dispatched["run_id"])
        chunks = Chunk.objects.filter(run_id=dispatched["run_id"])
        # The run plans as it goes: finished once planned to the end and all settled.
        _wait(lambda: runs.exclude(state=Run.State.RUNNING).exists()
              and not chunks.exclude(state__in=SETTLED).exists(), timeout,
              f"run {dispatched['run_id']} to be acknowledged")
        run = runs.get()
        durations = sorted(chunks.values_list("duration_ms", flat=True))
        ledger = chunks.aggregate(last_ack=Max("acknowledged_at"),
                                  first_start=Min("last_delivery_at"))
        rows = sum(chunks.values_list("rows_deleted", flat=True))
        seconds = (ledger["last_ack"] - run.created_at).total_seconds()
        spent = efficiency.time_spent(chunks, run.created_at, ledger["last_ack"])
        return Result(
            f"pipeline_{scheme}", label, rows, seconds,
            chunks=len(durations), chunk_size=run.next_chunk_size,
            first_chunk_size=run.chunk_size, window=run.window,
            command_to_first_chunk_s=round(
                (ledger["first_start"] - command_started).total_seconds(), 3),
            chunk_p99_ms=percentile(durations, 99), chunk_max_ms=durations[-1],
            dispatch_seconds=dispatched["seconds"], dispatcher_rss_mb=rss_mb,
            dispatch_ms_per_chunk=round(1000 * dispatched["seconds"] / len(durations), 3),
            first_chunk_after_s=round(
                (ledger["first_start"] - run.created_at).total_seconds(), 3),
            in_transactions_s=round(sum(durations) / 1000, 3),
            time_efficiency=spent["time_efficiency"], per_chunk_ms=spent["per_chunk_ms"],
            checks={"every chunk acknowledged":
                    not chunks.exclude(state=Chunk.State.ACKNOWLEDGED).exists()},
        )

    return contender


def handwritten_unnest(policy: Policy, timeout: float) -> Result:
    """The best hand-written SQL for the items predicate: keyset pages of (id, expiry),
    each deleted by one ``DELETE ... USING unnest(ids, expiries)`` in its own transaction.

    Pages are as large as the chunks the latest items run reached, for a like-for-like
    ratio,
    and the arrays travel as literals as the pipeline's do (see PairsIn).
    """
    cutoff = timezone.now()
    size = Run.objects.filter(policy=policy.name, scheme=ITEMS).latest(
        "created_at").next_chunk_size
    page_sql = (
        f'SELECT id, expires_at FROM "{SeatHold._meta.db_table}" WHERE status = \'held\' '
        "AND expires_at <= %s AND (expires_at, id) > (%s, %s) ORDER BY expires_at, id LIMIT %s"
    )
    delete_sql = (
        f'DELETE FROM "{SeatHold._meta.db_table}" AS h '
        "USING unnest(%s::bigint[], %s::timestamptz[]) "
        "AS planned(id, expires_at) WHERE h.id = planned.id "
        "AND h.expires_at = planned.expires_at AND h.status = 'held' AND h.expires_at <= %s"
    )
    after = (datetime(1, 1, 1, tzinfo=UTC), 0)
    deleted, durations = 0, []
    started = time.perf_counter()
    with connection.cursor() as cursor:
        while True:
            cursor.execute(page_sql, [cutoff, *after, size])
            page = cursor.fetchall()
            if not page:
                break
            begun = time.perf_counter()
            with transaction.atomic():
                cursor.execute(delete_sql, [array_literal(pk for pk, _ in page),
                                            array_literal(e for _, e in page), cutoff])
                deleted += cursor.rowcount
            durations.append((time.perf_counter() - begun) * 1000)
            after = (page[-1][1], page[-1][0])
    seconds = time.perf_counter() - started
    durations.sort()
    return Result("handwritten_unnest", "Hand-written DELETE ... USING unnest", deleted,
                  seconds, chunks=len(durations), chunk_size=size,
                  chunk_p99_ms=round(percentile(durations, 99), 1),
                  chunk_max_ms=round(durations[-1], 1))


def one_task_per_row(sample: int):
    def contender(policy: Policy, timeout: float) -> Result:
        cutoff = timezone.now()
        rows = list(policy.eligible_rows(policy.freeze(cutoff)).order_by("?").values_list(
            "pk", policy.observed_field)[:sample])
        ids = [pk for pk, _ in rows]
        started = time.perf_counter()
        with transaction.atomic():
            for pk, observed in rows:
                async_task("config.devtools.bench.tasks.expire_one", pk, observed.isoformat(),
                           cutoff.isoformat(), group="bench-one-task-per-row")
        # Holds a learner renewed meanwhile are no longer eligible, and stay.
        left = policy.eligible_rows(policy.freeze(cutoff)).filter(pk__in=ids)
        _wait(lambda: not left.exists(), timeout, "the per-row tasks")
        seconds = time.perf_counter() - started
        _wait(lambda: get_broker().queue_size() == 0, timeout, "the queue to drain")
        deleted = len(ids) - SeatHold.objects.filter(pk__in=ids).count()
        return Result("one_task_per_row", "One task per row (extrapolated)", deleted,
                      seconds, extrapolated=True, chunks=len(rows), chunk_size=1)

    return contender


def cluster_ready(timeout: float) -> None:
    """Return once the cluster has run a task."""
    # Saved even though successes are not (save_limit -1), so its arrival shows.
    task_id = async_task("config.devtools.bench.tasks.ready", q_options={"save": True})
    _wait(lambda: Task.objects.filter(id=task_id).exists(), timeout, "the qcluster to start")


def _dispatch_in_subprocess(policy: Policy, scheme: str) -> tuple[dict, float]:
    """Dispatch as its own process; return its JSON and its peak RSS in MB.

    The peak is the kernel's high-water mark of the process's own memory (VmHWM),
    sampled until it exits. Its rusage would not do: a child started by vfork and exec
    is charged with the parent's peak as well.
    """
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(
            [sys.executable, str(MANAGE), "cleanup_dispatch", "--policy", policy.name,
             "--scheme", scheme, "--json"],
            stdout=out, stderr=err, env=os.environ.copy(), text=True,
        )
        peak_kb = 0
        while process.poll() is None:
            peak_kb = max(peak_kb, memory_kb(process.pid, "VmHWM"))
            time.sleep(0.02)
        out.seek(0)
        err.seek(0)
        output, errors = out.read(), err.read()
    if process.returncode != 0:
        raise RuntimeError(f"cleanup_dispatch failed: {errors[-2000:]}")
    return json.loads(output.strip().splitlines()[-1]), round(peak_kb / 1024, 1)


def _wait(done, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


# The contenders of a range-only run (--only range): the one DELETE and the range runs.
RANGE_ONLY = ("single_delete", "pipeline_range_first", "pipeline_range_second",
              "pipeline_range")


def contenders(per_row_sample: int, *, only: str | None = None) -> dict:
    """The contenders in the order they run.

    Each pipeline scheme first runs with its starting chunk size (nothing learned yet),
    then with the size learned from the runs before, as a policy scheduled every minute
    does. Range runs three times: learning from 500-row chunks, whose fixed costs weigh
    most, undershoots once.
    """
    every = {
        "single_delete": single_delete,
        "pipeline_range_first": pipeline(RANGE, "Pipeline, range, first run"),
        "pipeline_range_second": pipeline(RANGE, "Pipeline, range, second run"),
        "pipeline_range": pipeline(RANGE, "Pipeline, range, third run"),
        "pipeline_items_first": pipeline(ITEMS, "Pipeline, items, first run"),
        "pipeline_items": pipeline(ITEMS, "Pipeline, items, second run"),
        "handwritten_unnest": handwritten_unnest,
        "one_task_per_row": one_task_per_row(per_row_sample),
    }
    if only == RANGE:
        return {name: every[name] for name in RANGE_ONLY}
    return every
