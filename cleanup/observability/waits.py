"""Why a run waits, and how long it worked: what the run page says beside its totals.

A chunk's deliveries are its history (``Chunk.history``, written by
cleanup.engine.transitions as each delivery starts and ends). From them and the
ledger, a running run says in words what it waits on: its policy halted, its window
full of chunks retrying on one cause, the next redelivery, a delivery in progress, no
worker taking the queue. Its rate is counted over the time it worked, not the time it
was stuck: the time covered by its committed chunks' transactions, gaps shorter than
``WORKING_GAP`` (the queue's own latency between chunks) counted as work.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection
from django.db.models import Max
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django_q.conf import Conf

from cleanup import display
from cleanup.engine import halts
from cleanup.models import Chunk, Run, WorkerHeartbeat

WORKING_GAP = timedelta(seconds=5)
# A delivery without an outcome that began longer ago than django-q2's retry has been
# given up on by the broker (its worker died or froze): it is redelivered, not applying.
IN_PROGRESS_NO_LONGER_THAN = timedelta(seconds=Conf.RETRY or 60)


@dataclass(frozen=True)
class Delivery:
    """One delivery of a chunk, as its history keeps it."""

    number: int
    began_at: datetime | None
    worker: str  # host:pid (the token that tells restarted pids apart is left out)
    ended_at: datetime | None
    outcome: str
    rows: int
    locked: int
    retries: int
    error: str

    @property
    def seconds(self) -> float | None:
        if self.began_at is None or self.ended_at is None:
            return None
        return max((self.ended_at - self.began_at).total_seconds(), 0.0)

    @property
    def ended(self) -> bool:
        return self.ended_at is not None


def deliveries(chunk: Chunk) -> list[Delivery]:
    """A chunk's deliveries, newest first, as far as its history keeps them."""
    return read_history(chunk.history)


def read_history(history) -> list[Delivery]:
    """The deliveries a ``Chunk.history`` value holds, newest first.

    It is a JSON column an operator could have edited: an entry that is not an object,
    or a field of the wrong kind, reads as unknown rather than failing.
    """
    history = history if isinstance(history, list) else []
    found = [_delivery(entry) for entry in history if isinstance(entry, dict)]
    return sorted(found, key=lambda d: d.number, reverse=True)


def _delivery(entry: dict) -> Delivery:
    worker = str(entry.get("worker") or "")
    return Delivery(
        number=_count(entry.get("n")),
        began_at=_moment(entry.get("at")),
        worker=":".join(worker.split(":")[:2]),
        ended_at=_moment(entry.get("ended_at")),
        outcome=str(entry.get("outcome") or ""),
        rows=_count(entry.get("rows")),
        locked=_count(entry.get("locked")),
        retries=_count(entry.get("retries")),
        error=str(entry.get("error") or ""),
    )


def _moment(value) -> datetime | None:
    try:
        return parse_datetime(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _count(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def not_kept(chunk: Chunk) -> int:
    """How many of the chunk's first deliveries its history no longer holds (as
    ``read_history`` reads it: a value edited into something else holds none)."""
    return max(chunk.deliveries - len(deliveries(chunk)), 0)


def working_seconds(run: Run) -> float:
    """The time the run's committed chunks covered, their overlaps counted once and a
    gap shorter than ``WORKING_GAP`` counted as work: one statement, gaps and islands
    over the run's chunks (a committed chunk's transaction ends at ``committed_at`` and
    lasted ``duration_ms``)."""
    table = Chunk._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH spans AS (
                SELECT committed_at - duration_ms * interval '1 millisecond' AS began,
                       committed_at AS ended
                FROM "{table}" WHERE run_id = %s AND committed_at IS NOT NULL
            ), marked AS (
                SELECT began, ended,
                       max(ended) OVER (ORDER BY began, ended ROWS BETWEEN UNBOUNDED
                                        PRECEDING AND 1 PRECEDING) AS reached
                FROM spans
            ), islands AS (
                SELECT began, ended,
                       count(*) FILTER (WHERE reached IS NULL OR began > reached + %s)
                           OVER (ORDER BY began, ended) AS island
                FROM marked
            )
            SELECT coalesce(sum(extract(epoch FROM last - first)), 0)
            FROM (SELECT min(began) AS first, max(ended) AS last
                  FROM islands GROUP BY island) AS worked
            """,
            [run.pk, WORKING_GAP],
        )
        return float(cursor.fetchone()[0])


def why_it_waits(run: Run, now: datetime | None = None, *, halted: bool = True) -> list[str]:
    """What a running run waits on, in words, most pressing first; empty for a run
    that has finished (or waits on nothing it can name). ``halted``: its policy's halts
    too (a caller that lists them itself leaves them out)."""
    if run.state != Run.State.RUNNING:
        return []
    now = now or timezone.now()
    open_halts = halts.open_halts(run.policy)
    reasons = [f"halted: {halts.describe(halt, now)} (nothing new is planned until it is "
               "resumed)" for halt in open_halts] if halted else []
    if run.planning_error:
        reasons.append(f"planning failed: {run.planning_error.strip().splitlines()[0]}")
    unfinished = list(run.chunks.filter(state__in=Chunk.UNFINISHED).order_by("chunk_id")
                      .only("chunk_id", "state", "cause", "history", "enqueued_at",
                            "last_delivery_at", "deliveries", "run_id"))
    applying = [(chunk, last) for chunk in unfinished
                if (last := _in_progress(chunk, now)) is not None]
    reasons += [f"#{chunk.chunk_id} being applied by {last.worker} for "
                f"{display.duration((now - last.began_at).total_seconds())}"
                for chunk, last in applying]
    retrying = [chunk for chunk in unfinished if chunk.state == Chunk.State.RETRYING]
    if retrying:
        reasons.append(_retrying(run, retrying, len(unfinished)))
        due = min(chunk.last_delivery_at or now for chunk in retrying) \
            + IN_PROGRESS_NO_LONGER_THAN
        reasons.append(f"next redelivery at about {display.utc_text(due, date=False)} UTC "
                       f"(django-q2 redelivers after {IN_PROGRESS_NO_LONGER_THAN.seconds} s)")
    waiting = [chunk for chunk in unfinished
               if chunk.state == Chunk.State.ENQUEUED and not _in_progress(chunk, now)]
    if waiting and not applying:
        reasons.append(_queued(waiting, now))
    if (not reasons and not open_halts and not run.planned_all
            and len(unfinished) < run.window):
        # (A halted policy plans nothing: said by the caller where it lists the halts.)
        reasons.append("planning its next chunks")
    return reasons


def _in_progress(chunk: Chunk, now: datetime) -> Delivery | None:
    history = deliveries(chunk)
    last = history[0] if history else None
    if (last is None or last.ended or last.began_at is None
            or now - last.began_at > IN_PROGRESS_NO_LONGER_THAN):
        return None
    return last


def _retrying(run: Run, retrying: list[Chunk], unfinished: int) -> str:
    cause, _ = Counter(chunk.cause or "an unknown error" for chunk in retrying).most_common(1)[0]
    since = min((began for chunk in retrying if (began := _streak_began(chunk))),
                default=None)  # chunks retried before deliveries were recorded have none
    full = "window full: " if unfinished >= run.window and not run.planned_all else ""
    counted = f"{len(retrying)} of {unfinished} chunks in flight" if full else (
        f"{len(retrying)} chunk{'s' if len(retrying) != 1 else ''}")
    when = f" since {display.utc_text(since, date=False)} UTC" if since else ""
    return f"{full}{counted} retrying on {cause}{when}"


def _streak_began(chunk: Chunk) -> datetime | None:
    """When the chunk's current run of failed deliveries began: the first of its
    latest deliveries that were all left for redelivery."""
    began = None
    for delivery in deliveries(chunk):
        if delivery.ended and delivery.outcome != "left for redelivery":
            break
        began = delivery.began_at or began
    return began


def _queued(waiting: list[Chunk], now: datetime) -> str:
    oldest = min(chunk.enqueued_at or now for chunk in waiting)
    text = (f"{len(waiting)} chunk{'s' if len(waiting) != 1 else ''} queued, the oldest "
            f"sent {display.ago(oldest, now)}")
    last_beat = WorkerHeartbeat.objects.aggregate(at=Max("beat_at"))["at"]
    if last_beat is None:
        return f"{text}; no worker has ever beaten: start manage.py qcluster"
    if now - last_beat > IN_PROGRESS_NO_LONGER_THAN:
        return f"{text}; no worker has beaten since {display.ago(last_beat, now)}"
    return text
