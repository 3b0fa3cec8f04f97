"""Hand-written deletes the pipeline is measured against: the unnest loop on one
connection, and each scheme's limit, two connections running the scheme's own kind of
statement at the pipeline's chunk size with nothing else to do."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import suppress
from datetime import UTC, datetime

from django.db import connection, transaction
from django.db.models import F, Max, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from cleanup.expressions import array_literal
from cleanup.models import Run
from cleanup.policies import ITEMS, RANGE, Policy
from config.devtools.bench.probes import percentile
from config.devtools.bench.result import Result
from reservations.models import SeatHold

HOLDS = SeatHold._meta.db_table
# A page of the items order, (expiry, id), read from the held holds' expiry index.
PAGE_SQL = (
    f'SELECT id, expires_at FROM "{HOLDS}" WHERE status = \'held\' '
    "AND expires_at <= %s AND (expires_at, id) > (%s, %s) ORDER BY expires_at, id LIMIT %s"
)
# The page's holds that are still held with the expiry they were read with.
DELETE_SQL = (
    f'DELETE FROM "{HOLDS}" AS h '
    "USING unnest(%s::bigint[], %s::timestamptz[]) "
    "AS planned(id, expires_at) WHERE h.id = planned.id "
    "AND h.expires_at = planned.expires_at AND h.status = 'held' AND h.expires_at <= %s"
)
CONNECTIONS = 2


def handwritten_unnest(policy: Policy, timeout: float) -> Result:
    """The best hand-written SQL for the items predicate: keyset pages of (id, expiry),
    each deleted by one ``DELETE ... USING unnest(ids, expiries)`` in its own transaction.

    Pages are as large as the chunks the latest items run reached, for a like-for-like
    ratio, and the arrays travel as literals as the pipeline's do (see PairsIn).
    """
    cutoff = timezone.now()
    size = latest_chunk_size(policy, ITEMS)
    pages = KeysetPages(cutoff, size)
    chunks: list[tuple[int, float]] = []
    started = time.perf_counter()
    _delete_pages(pages, cutoff, chunks)
    seconds = time.perf_counter() - started
    return _result("handwritten_unnest", "Hand-written DELETE ... USING unnest", chunks,
                   seconds, size)


def two_connections_unnest(policy: Policy, timeout: float) -> Result:
    """The items scheme's limit: the unnest loop on two connections, at the items runs'
    chunk size.

    Both take their pages from one keyset, the next page read under a lock on the
    taker's own connection, then deleted in its own transaction while the other
    connection reads. Rather than the key space split in two by id: the pages are the
    loop's own (the expiry index read in order, no id filter thinning each page), and
    neither connection idles while the other still has work, whatever the ids' spread.
    """
    cutoff = timezone.now()
    size = latest_chunk_size(policy, ITEMS)
    pages = KeysetPages(cutoff, size)
    per_connection, seconds = on_two_connections(
        lambda chunks: _delete_pages(pages, cutoff, chunks))
    return _result("two_connections_unnest", "Limit: 2 connections, unnest loop",
                   [chunk for chunks in per_connection for chunk in chunks], seconds, size)


def two_connections_range(policy: Policy, timeout: float) -> Result:
    """The range scheme's limit: two connections deleting the pipeline's range chunks.

    Each takes the next ``[lo, hi)`` from a shared counter and deletes it with a range
    chunk's own statement, ``policy.eligible_rows(frozen).filter(pk__gte=lo,
    pk__lt=hi).delete()`` (one DELETE carrying the whole predicate; checked), in a
    transaction of its own. The ranges hold as many eligible rows as the latest range
    run's chunks (the policy's chunk size if none ran) and are cut as the pipeline's
    planning cuts them, but before the clock starts: the limit plans for free, where the
    pipeline reads each next range in a chunk's commit.
    """
    frozen = policy.freeze(timezone.now())
    eligible = policy.eligible_rows(frozen)
    size = latest_chunk_size(policy, RANGE)
    ranges = iter(_ranges(eligible, size))
    taking = threading.Lock()

    def take() -> tuple[int, int] | None:
        with taking:
            return next(ranges, None)

    # Both connections' statements, each appended whole (a list's append is atomic).
    sent: list[str] = []

    def delete_ranges(chunks: list[tuple[int, float]]) -> None:
        with connection.execute_wrapper(_recording(sent)):
            while bounds := take():
                begun = time.perf_counter()
                with transaction.atomic():
                    deleted, _ = eligible.filter(pk__gte=bounds[0], pk__lt=bounds[1]).delete()
                chunks.append((deleted, (time.perf_counter() - begun) * 1000))

    per_connection, seconds = on_two_connections(delete_ranges)
    chunks = [chunk for done in per_connection for chunk in done]
    return _result("two_connections_range", "Limit: 2 connections, range", chunks, seconds,
                   size, checks={"one DELETE statement per range": len(sent) == len(chunks)
                                 and all(sql.startswith("DELETE") for sql in sent)})


def latest_chunk_size(policy: Policy, scheme: str) -> int:
    """The median size of the chunks of the policy's latest run of ``scheme``; its chunk
    size if none ran. Not the size the run's sizing last chose: where a run's span ends
    among few eligible rows, its last chunks are sparse and slow, and the size it ends
    at is a fraction of the size its chunks held."""
    latest = Run.objects.filter(policy=policy.name, scheme=scheme).order_by(
        "-created_at").first()
    return median_rows(latest.chunks.all()) if latest is not None else policy.chunk_size


def median_rows(chunks) -> int:
    """The median of the chunks' planned rows (the upper one of an even count)."""
    rows = sorted(chunks.filter(planned_rows__gt=0).values_list("planned_rows", flat=True))
    return rows[len(rows) // 2] if rows else 0


class KeysetPages:
    """Pages of eligible (id, expiry) in the items order, each handed out once.

    ``take`` reads the next page on the caller's connection under a lock, so takers on
    several connections never get the same page; an empty page once none is left.
    """

    def __init__(self, cutoff: datetime, size: int):
        self.cutoff = cutoff
        self.size = size
        self.after = (datetime(1, 1, 1, tzinfo=UTC), 0)
        self.lock = threading.Lock()

    def take(self, cursor) -> list[tuple[int, datetime]]:
        with self.lock:
            cursor.execute(PAGE_SQL, [self.cutoff, *self.after, self.size])
            page = cursor.fetchall()
            if page:
                self.after = (page[-1][1], page[-1][0])
            return page


def on_two_connections(work: Callable[[list], None]) -> tuple[list[list], float]:
    """Run ``work(chunks)`` on two threads, each on a connection of its own, and return
    what each appended to its list and the seconds from both starting to both ending.

    The connections are opened before the clock starts (the pipeline's workers have
    theirs open) and closed at the end.
    """
    per_connection: list[list] = [[] for _ in range(CONNECTIONS)]
    errors: list[BaseException] = []
    ready = threading.Barrier(CONNECTIONS + 1)

    def run(chunks: list) -> None:
        try:
            connection.ensure_connection()
            ready.wait()
            work(chunks)
        except BaseException as exc:  # raised again below, not lost with the thread
            errors.append(exc)
            ready.abort()
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(chunks,), name=f"limit-{number}")
               for number, chunks in enumerate(per_connection)]
    for thread in threads:
        thread.start()
    # Broken when a thread failed to connect: its error is raised below.
    with suppress(threading.BrokenBarrierError):
        ready.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    if errors:
        raise errors[0]
    return per_connection, seconds


def _ranges(eligible, size: int) -> list[tuple[int, int]]:
    """Contiguous ``[lo, hi)`` covering the eligible ids, ``size`` eligible rows each (the
    last one fewer): each starts at every ``size``-th eligible id, as a range chunk
    starts at the first eligible id of its frontier."""
    starts = list(
        eligible.annotate(place=(Window(RowNumber(), order_by=F("pk").asc()) - 1) % size)
        .filter(place=0).order_by("pk").values_list("pk", flat=True))
    if not starts:
        return []
    end = eligible.aggregate(last=Max("pk"))["last"] + 1
    return list(zip(starts, [*starts[1:], end], strict=True))


def _delete_pages(pages: KeysetPages, cutoff: datetime,
                  chunks: list[tuple[int, float]]) -> None:
    """Take page after page on this thread's connection and delete each in a transaction
    of its own; append the rows and milliseconds of each to ``chunks``."""
    with connection.cursor() as cursor:
        while page := pages.take(cursor):
            begun = time.perf_counter()
            with transaction.atomic():
                cursor.execute(DELETE_SQL, [array_literal(pk for pk, _ in page),
                                            array_literal(expiry for _, expiry in page),
                                            cutoff])
                deleted = cursor.rowcount
            chunks.append((deleted, (time.perf_counter() - begun) * 1000))


def _recording(sent: list[str]):
    """An execute wrapper that keeps each statement's SQL, nothing else."""
    def wrapper(execute, sql, params, many, context):
        sent.append(sql)
        return execute(sql, params, many, context)

    return wrapper


def _result(name: str, label: str, chunks: list[tuple[int, float]], seconds: float,
            size: int, checks: dict | None = None) -> Result:
    durations = sorted(ms for _, ms in chunks)
    return Result(name, label, sum(rows for rows, _ in chunks), seconds, chunks=len(chunks),
                  chunk_size=size,
                  chunk_p99_ms=round(percentile(durations, 99), 1) if durations else None,
                  chunk_max_ms=round(durations[-1], 1) if durations else None,
                  checks=checks or {})
