"""Where a pipeline run's wall time went, read from its chunks' ledger rows.

Time efficiency is the share of the run's wall time (its creation to its last
acknowledgement) during which at least one chunk transaction was executing its
statement on the database: the union of the chunks' ``[committed_at - duration_ms,
committed_at]`` intervals over the wall time. Each chunk's own time splits into four
parts, all from the ledger's timestamps, and one part of its statement's:

- waiting: from its message being written to a worker starting its delivery (the
  planning chunk's commit, the broker's poll, a busy worker);
- starting: from the delivery's start to its statement's (counting the delivery,
  reading the run);
- statement: the chunk's transaction up to its outcome (``duration_ms``);
- finishing: from the outcome to the acknowledgement (the top-up planning the next
  chunks, settling the run, the commit, django-q2 saving the result and the ack);
- cpu wait: of the statement, how long its worker waited for a CPU (``cpu_wait_ms``: a
  busy client, not a slow database).

Two more figures put these together. A chunk's *fixed cost* is its starting plus its
finishing. Part of finishing is not the worker's: django-q2's monitor, another
process, acknowledges the message after the worker handed the result over. So the
worker's own share is *between*: from a chunk's outcome to the start of the next
statement on the same worker (its delivery's history names the worker). That is the
top-up, the settling and the commit, django-q2 taking the result and the next
message, then starting that chunk, and any wait for a message in between.
"""

from __future__ import annotations

from datetime import timedelta

from cleanup.models import Chunk
from config.devtools.bench.probes import percentile

PARTS = ("waiting", "starting", "statement", "finishing", "fixed", "between", "cpu wait")


def time_spent(chunks, started, ended) -> dict:
    """The run's time efficiency and each part's median and p95 per chunk, in ms."""
    rows = list(chunks.filter(state=Chunk.State.ACKNOWLEDGED).values_list(
        "enqueued_at", "last_delivery_at", "committed_at", "acknowledged_at", "duration_ms",
        "cpu_wait_ms", "history"))
    wall = (ended - started).total_seconds()
    intervals = sorted((committed - timedelta(milliseconds=duration), committed)
                       for _, _, committed, _, duration, _, _ in rows)
    parts: dict[str, list[float]] = {part: [] for part in PARTS}
    per_worker: dict[str, list[tuple]] = {}
    for enqueued, delivered, committed, acknowledged, duration, cpu_wait, history in rows:
        statement_start = committed - timedelta(milliseconds=duration)
        starting = max(0.0, _ms(statement_start - delivered))
        finishing = _ms(acknowledged - committed)
        parts["waiting"].append(_ms(delivered - enqueued))
        parts["starting"].append(starting)
        parts["statement"].append(float(duration))
        parts["finishing"].append(finishing)
        parts["fixed"].append(starting + finishing)
        if cpu_wait is not None:
            parts["cpu wait"].append(float(cpu_wait))
        if history:
            per_worker.setdefault(history[-1].get("worker", ""), []).append(
                (statement_start, committed))
    for statements in per_worker.values():
        statements.sort()
        parts["between"] += [_ms(following[0] - ended_at) for (_, ended_at), following
                             in zip(statements, statements[1:], strict=False)]
    return {
        "time_efficiency": round(_covered(intervals) / wall, 4) if wall else None,
        "per_chunk_ms": {part: _summary(sorted(values)) for part, values in parts.items()
                         if values},
    }


def _summary(values: list[float]) -> dict:
    return {"p50": round(percentile(values, 50), 1), "p95": round(percentile(values, 95), 1),
            "sum_s": round(sum(values) / 1000, 2)}


def _covered(intervals) -> float:
    """Seconds covered by at least one of the sorted intervals."""
    total, end = 0.0, None
    for begin, finish in intervals:
        if end is None or begin > end:
            total += (finish - begin).total_seconds()
            end = finish
        elif finish > end:
            total += (finish - end).total_seconds()
            end = finish
    return total


def _ms(delta) -> float:
    return delta.total_seconds() * 1000
