"""The ways of expiring the same holds that the benchmark puts side by side."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from django.db import connection, transaction
from django.db.models import Max, Min
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_q.brokers import get_broker
from django_q.models import Task
from django_q.tasks import async_task

from cleanup.models import Chunk, Run
from cleanup.policies import ITEMS, RANGE, Policy
from config.devtools import MANAGE
from config.devtools.bench import efficiency
from config.devtools.bench.handwritten import (
    handwritten_unnest,
    median_rows,
    two_connections_range,
    two_connections_unnest,
)
from config.devtools.bench.probes import memory_kb, percentile
from config.devtools.bench.result import Result
from reservations.models import SeatHold

SETTLED = (Chunk.State.ACKNOWLEDGED, Chunk.State.DEAD_LETTERED)


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
            chunks=len(durations), chunk_size=median_rows(chunks),
            first_chunk_size=run.chunk_size, last_chunk_size=run.next_chunk_size,
            window=run.window,
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


# The contenders of a range-only run (--only range): the one DELETE, the range runs and
# their limit.
RANGE_ONLY = ("single_delete", "pipeline_range_first", "pipeline_range_second",
              "pipeline_range", "two_connections_range")


def contenders(per_row_sample: int, *, only: str | None = None) -> dict:
    """The contenders in the order they run.

    Each pipeline scheme first runs with its starting chunk size (nothing learned yet),
    then with the size learned from the runs before, as a policy scheduled every minute
    does. Range runs three times: learning from 500-row chunks, whose fixed costs weigh
    most, undershoots once. Each scheme's two-connection limit runs right after its
    latest run, at the median size of that run's chunks.
    """
    every = {
        "single_delete": single_delete,
        "pipeline_range_first": pipeline(RANGE, "Pipeline, range, first run"),
        "pipeline_range_second": pipeline(RANGE, "Pipeline, range, second run"),
        "pipeline_range": pipeline(RANGE, "Pipeline, range, third run"),
        "two_connections_range": two_connections_range,
        "pipeline_items_first": pipeline(ITEMS, "Pipeline, items, first run"),
        "pipeline_items": pipeline(ITEMS, "Pipeline, items, second run"),
        "two_connections_unnest": two_connections_unnest,
        "handwritten_unnest": handwritten_unnest,
        "one_task_per_row": one_task_per_row(per_row_sample),
    }
    if only == RANGE:
        return {name: every[name] for name in RANGE_ONLY}
    return every
