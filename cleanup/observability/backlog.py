"""A policy's backlog now: how many rows are eligible and how long the oldest of them
has waited, read within a time budget so that a scrape stays cheap while a run
deletes a million rows.

The count is exact up to ``COUNT_CAP`` (at the cap it means "at least that many"); it
used to be a planner estimate, which said 39,773 where 5 rows were eligible. The
statement that counts also takes the oldest of the rows it counted, so below the cap
both figures are exact from one bounded read. At the cap, the oldest comes from the
policy's index: ``MIN(observed)`` is one index probe.

Except while a run empties that index. The rows it deleted stay in the index until
VACUUM removes them (and until every transaction on the server older than the
deletes has ended), and a scan from the oldest end reads each of them from the heap
before it reaches a live row: 0.4 s per scrape during a million-row run on this
project's machine, more the longer between scrapes. So every statement here runs
within a budget (a scrape's ``BUDGET_MS``; the console's second, see
cleanup.observability.overview). Past it, the oldest is the older of the rows counted
and the rows the policy's chunks in flight name (a run plans the oldest rows first): a
lower bound on the age, and ``Backlog.exact`` is False.

A figure that could not be read within the budget is never 0. While long
transactions hold VACUUM back, even the count can run out of it at most scrapes (177
of 180 in a quarter of an hour), and a 0 there said "no backlog" over 7,070 rows
eligible for 30 days, resetting the backlog alert's ``for:`` at each scrape. So an
inexact reading repeats the last exact one (``read_at`` says when it was taken),
raised to whatever a lower bound read now says is more; with neither, there is no
reading at all (``Backlog.measured`` is False), and /metrics exports no sample.

The last exact reading is kept in the database (``BacklogReading``), the newest one
whichever process took it: a web server's second worker once repeated its own reading
of 10,000 rows, ten minutes old, after the first had read 0, and paged for a backlog
already gone. One statement writes it (``_keep``), and only the inexact path reads it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from functools import reduce
from math import inf
from operator import or_
from typing import TypeVar

from django.db import OperationalError, connection, transaction
from django.db.models import BooleanField, Count, ExpressionWrapper, Min, Q, QuerySet
from django.db.models.expressions import RawSQL
from django.utils import timezone
from psycopg.errors import QueryCanceled

from cleanup.expressions import Clamped
from cleanup.models import BacklogReading, Chunk, Run
from cleanup.policies import Policy

T = TypeVar("T")

# Counting stops here: a scrape reads at most this many eligible rows per policy
# (20 ms for 10,000 on this project's 2-core machine, during a run).
COUNT_CAP = 10_000
# Per statement: seven policies at a few milliseconds each, and the one or two whose
# index a run is emptying at most one statement over this, keep the backlog's share
# of a scrape near 0.1 s (87 ms p50 during a million-row run).
BUDGET_MS = 40
# Of each items chunk in flight, the rows a lower bound looks at: its oldest.
ITEMS_LOOKED_AT = 10
# After the index could not be read within a budget, the next readings of this process
# within the same budget take the lower bound at once for this long, rather than waste it.
RETRY_AFTER_SECONDS = 30

# When each reading last went over a budget, by key and budget: this process's own
# memory. A scrape's miss of its 40 ms does not stop the console trying its second.
_over_budget: dict[tuple[str, int], float] = {}


@dataclass(frozen=True)
class Backlog:
    rows: int  # eligible rows, counted up to COUNT_CAP
    oldest_observed: datetime | None  # the oldest eligible row's observed value
    exact: bool = True  # False: read past the budget (see above)
    # When the figures were read exactly: now, or for an inexact reading the earlier
    # exact one it repeats; None for a bare lower bound (or a read outside the budget).
    read_at: datetime | None = None

    @property
    def capped(self) -> bool:
        """Whether counting stopped at the engine's cap: there may be more."""
        return self.rows >= COUNT_CAP

    @property
    def measured(self) -> bool:
        """Whether the figures say anything: not for a read that ran out of budget
        before it counted a row, with no exact reading before it to repeat."""
        return self.exact or self.read_at is not None or self.rows > 0


class Budget:
    """Statements run through ``read()`` are cancelled after ``budget_ms``; ``read()``
    then returns None.

    Each statement runs in a transaction (or a savepoint) of its own with the limit
    set locally: never set on the session, which a transaction pooler would hand, with
    the limit still on it, to another client.
    """

    def __init__(self, budget_ms: int = BUDGET_MS):
        self.budget_ms = budget_ms

    def read(self, statement: Callable[[], T]) -> T | None:
        """Run ``statement``; None if the database cancelled it past the budget."""
        nested = connection.in_atomic_block
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                previous = _set_timeout(cursor, f"{self.budget_ms}ms")
                result = statement()
                if nested:
                    # A savepoint released keeps a SET LOCAL to the end of the outer
                    # transaction (a test's, or a caller's): put it back by hand.
                    _set_timeout(cursor, previous)
                return result
        except OperationalError as exc:
            if isinstance(exc.__cause__, QueryCanceled):
                return None
            raise


def read_backlog(rows: QuerySet, field: str, budget: Budget, *,
                 cap: int | None = None, key: str | None = None) -> Backlog:
    """Count ``rows`` up to ``cap`` and find the oldest ``field``, within ``budget``.

    Below the cap both are exact from one statement. At the cap the oldest comes from
    the index; past the budget it is the oldest of the rows counted (``exact`` False),
    and for ``RETRY_AFTER_SECONDS`` this process does not try the index again for the
    same ``key`` within the same budget. Past the budget, the last exact reading under
    ``key`` stands wherever it says more than what was read; nothing read and none
    before: no rows, ``exact`` False, not ``measured`` (a caller must not export that 0
    as a figure). ``cap`` defaults to ``COUNT_CAP``.
    """
    cap = COUNT_CAP if cap is None else cap
    rows = rows.order_by()
    counted = budget.read(lambda: _count(rows, field, cap))
    if counted is None:
        return at_least(Backlog(0, None, exact=False), kept(key, budget))
    if counted.rows < cap:
        return remember(counted, key, budget)
    slow = (key, budget.budget_ms)
    if key is None or time.monotonic() - _over_budget.get(slow, -inf) >= RETRY_AFTER_SECONDS:
        oldest = budget.read(lambda: _oldest(rows, field))
        if oldest is not None:
            return remember(Backlog(counted.rows, oldest), key, budget)
        if key is not None:
            _over_budget[slow] = time.monotonic()
    return at_least(Backlog(counted.rows, counted.oldest_observed, exact=False),
                    kept(key, budget))


def at_least(reading: Backlog, bound: Backlog | None) -> Backlog:
    """``reading``, inexact, raised to ``bound`` wherever that says more: more rows, an
    older oldest row. Either may be an earlier exact reading, whose ``read_at`` stays."""
    if bound is None:
        return reading
    oldest = [t for t in (reading.oldest_observed, bound.oldest_observed) if t]
    return Backlog(max(reading.rows, bound.rows), min(oldest, default=None), exact=False,
                   read_at=reading.read_at or bound.read_at)


def remember(reading: Backlog, key: str | None, budget: Budget) -> Backlog:
    """The exact ``reading``, stamped now and kept under ``key`` for every process."""
    reading = replace(reading, read_at=timezone.now())
    if key is not None:
        budget.read(lambda: _keep(key, reading))  # not kept past the budget: no matter
    return reading


_KEEP = f"""
    INSERT INTO "{BacklogReading._meta.db_table}" AS kept (key, rows, oldest_observed, read_at)
    VALUES (%s, %s, %s, %s)
    ON CONFLICT (key) DO UPDATE
    SET rows = EXCLUDED.rows, oldest_observed = EXCLUDED.oldest_observed,
        read_at = EXCLUDED.read_at
    WHERE kept.read_at < EXCLUDED.read_at
"""


def _keep(key: str, reading: Backlog) -> None:
    """Keep ``reading`` under ``key`` unless a newer one is kept already (a process
    whose reading lands late never puts an older one back)."""
    with connection.cursor() as cursor:
        cursor.execute(_KEEP, [key, reading.rows, reading.oldest_observed, reading.read_at])


def kept(key: str | None, budget: Budget) -> Backlog | None:
    """The newest exact reading kept under ``key``, by any process; None when there is
    none, or it could not be read within the budget."""
    if key is None:
        return None
    kept = budget.read(lambda: BacklogReading.objects.filter(key=key).first())
    if kept is None:
        return None
    return Backlog(kept.rows, kept.oldest_observed, exact=False, read_at=kept.read_at)


def backlogs(policies: list[Policy], now: datetime,
             budget: Budget) -> dict[str, Backlog | None]:
    """Each policy's backlog at ``now`` within ``budget``; None where nothing could be
    measured. A policy whose figures went over it also looks at the rows its chunks in
    flight name: the oldest rows left while a run deletes them oldest first.

    That lower bound is read within the scrape's ``BUDGET_MS`` whatever ``budget`` is:
    only /metrics shows a reading that is not exact (the console says unknown), and a
    table locked past the console's second would hold the page a second more.
    """
    found = {}
    for policy in policies:
        frozen = policy.freeze(now)
        reading = read_backlog(policy.eligible_rows(frozen), policy.observed_field, budget,
                               key=f"policy:{policy.name}")
        if not reading.exact:
            reading = at_least(reading, Budget().read(lambda: in_flight(policy, frozen)))  # noqa: B023
        found[policy.name] = reading if reading.measured else None
    return found


def in_flight(policy: Policy, frozen: dict[str, datetime]) -> Backlog:
    """The eligible rows among those the policy's unfinished chunks name (the oldest
    few of an items chunk, the whole id range of a range chunk): lower bounds on both
    figures."""
    # Only the keys of a range message: an items message is tens of kilobytes, and a
    # filter on the message column read every chunk's (150 ms for 1,700 chunks).
    ranges = Chunk.objects.filter(run__policy=policy.name, state__in=Chunk.UNFINISHED).annotate(
        partitioned=ExpressionWrapper(Q(message__has_key="partition"),
                                      output_field=BooleanField()),
    ).values_list("message__start_id", "message__end_id", "partitioned", "message__partition")
    # The items' keys in a subquery, empty when no items chunk is in flight.
    named = [Q(pk__in=_items_of_unfinished_chunks(policy)),
             *filter(None, (_in_range(policy, *keys) for keys in ranges))]
    found = policy.eligible_rows(frozen).filter(reduce(or_, named)).aggregate(
        rows=Count("pk"), oldest=Clamped(Min(policy.observed_field)))
    return Backlog(min(found["rows"], COUNT_CAP), found["oldest"], exact=False)


def _count(rows: QuerySet, field: str, cap: int) -> Backlog:
    """Count up to the cap, and the oldest of the rows counted (exact below the cap).

    Newest first where an index leads with ``field``: a run deletes the oldest rows
    first, so the newest end of the index is the live one (1,000 rows counted from
    the oldest end during a run read a million deleted ones first: 1.1 s). Without
    such an index, in whatever order the table gives them.
    """
    if _leads_an_index(rows.model, field):
        rows = rows.order_by(f"-{field}")
    found = rows.values(field)[:cap].aggregate(rows=Count("*"), oldest=Clamped(Min(field)))
    return Backlog(found["rows"], found["oldest"] if found["rows"] else None)


def _leads_an_index(model, field: str) -> bool:
    if model._meta.get_field(field).db_index:
        return True
    return any(index.fields and index.fields[0].lstrip("-") == field
               for index in model._meta.indexes)


def _oldest(rows: QuerySet, field: str) -> datetime | None:
    # Clamped outside the MIN, not inside: PostgreSQL answers MIN(column) from the
    # policy's index, and MIN(CASE ...) by reading every eligible row (0.9 s at a
    # million).
    return rows.aggregate(oldest=Clamped(Min(field)))["oldest"]


def _set_timeout(cursor, value: str) -> str:
    """Set statement_timeout for the transaction; return the value it had."""
    cursor.execute("SELECT current_setting('statement_timeout'), "
                   "set_config('statement_timeout', %s, true)", [value])
    return cursor.fetchone()[0]


def _items_of_unfinished_chunks(policy: Policy) -> RawSQL:
    """The first ``ITEMS_LOOKED_AT`` keys each unfinished items chunk names: its oldest
    rows, since a chunk lists its rows oldest first.

    Read out of the messages by PostgreSQL: all of a chunk's 2,000 keys, as query
    parameters or even unnested, took 44 ms of a scrape during a run.
    """
    pk = policy.model._meta.pk
    pk_type = pk.db_type(connection).replace("bigserial", "bigint").replace("serial", "integer")
    return RawSQL(
        # jsonb -> n is NULL past the end of the array, and for a range message.
        f"SELECT (chunk.message -> 'items' -> n ->> 0)::{pk_type} "
        f'FROM "{Chunk._meta.db_table}" AS chunk '
        f'JOIN "{Run._meta.db_table}" AS run ON run.id = chunk.run_id, '
        "generate_series(0, %s) AS n "
        "WHERE run.policy = %s AND chunk.state = ANY(%s)",
        [ITEMS_LOOKED_AT - 1, policy.name, list(Chunk.UNFINISHED)],
    )


def _in_range(policy: Policy, start, end, partitioned: bool, partition) -> Q | None:
    if not (isinstance(start, int) and isinstance(end, int)):
        return None  # an items chunk
    named = Q(pk__gte=start, pk__lt=end)
    if partitioned and policy.partition_column:
        named &= Q(**{policy.partition_column: partition})
    return named
