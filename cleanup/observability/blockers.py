"""The sessions that keep a policy's chunks waiting, read from PostgreSQL when asked.

Three readings, in one short transaction whose statements wait at most
``LOCK_TIMEOUT_MS`` for a lock and run at most ``STATEMENT_TIMEOUT_MS``: a table
locked ACCESS EXCLUSIVE would otherwise keep the console's own SELECT waiting as long
as it keeps the chunk.

- Table locks: the sessions holding, or queued for, a lock on the policy's table that
  a chunk's DELETE or UPDATE (ROW EXCLUSIVE) must wait behind. pg_locks never waits.
- Row locks: the transactions whose id is the ``xmax`` of a chunk's rows and that are
  still open. A plain SELECT of the system column takes no row lock and waits for
  none; a committed or aborted ``xmax`` holds no lock on its transaction id any more
  and drops out. Shared lockers share a multixact, whose members are listed.
- Waits now: the session working on a chunk holds the chunk's ledger row (a delivery
  locks it first), so the row's ``xmax`` names it, and ``pg_blocking_pids`` of it what
  it waits for that the two readings above do not see: a reminder row the product's
  trigger deletes with a hold, say.

A reading that runs out of time is said to be unknown, never "nothing blocks". Each
blocking session is shown as pg_stat_activity has it; what the console's role may not
see of another role's session (its query, state and transaction start) is said to be
hidden, with the grant that shows it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime

from django.db import DatabaseError, connection, transaction
from django.db.models import Count, TextField
from django.db.models.expressions import RawSQL
from django.db.models.functions import Coalesce
from django.utils import timezone

from cleanup.engine import messages, worker
from cleanup.exceptions import CleanupError
from cleanup.models import Chunk, Run
from cleanup.policies import Policy, get_policy

# The chunks read: unfinished ones, which will try again, and dead-lettered ones, which
# an operator may requeue. A finished chunk has nothing left to wait for.
PROBED = (*Chunk.UNFINISHED, Chunk.State.DEAD_LETTERED)
# At most this many chunks a page; the ones left out are counted.
MAX_CHUNKS = 20
STATEMENT_TIMEOUT_MS = 200
LOCK_TIMEOUT_MS = 100
# Reading the rows of a page's chunks stops past this; the chunks left are said so.
ROWS_BUDGET_SECONDS = 0.8
QUERY_LINE = 120
HIDDEN = "<insufficient privilege>"
# The table locks a DELETE or UPDATE (ROW EXCLUSIVE) must wait for.
CONFLICTING_MODES = ["ShareLock", "ShareRowExclusiveLock", "ExclusiveLock",
                     "AccessExclusiveLock"]
# ... of which this one also keeps the console's SELECT of the rows waiting.
READS_BLOCKED = "AccessExclusiveLock"
# A multixact member's lock mode (pg_get_multixact_members), as SQL says it.
SHARED_MODES = {"keysh": "FOR KEY SHARE", "sh": "FOR SHARE",
                "fornokeyupd": "FOR NO KEY UPDATE", "forupd": "FOR UPDATE",
                "nokeyupd": "an UPDATE not committed", "upd": "a change not committed"}


@dataclass(frozen=True)
class Session:
    """A blocking session as pg_stat_activity shows it to the console's role."""

    pid: int
    application_name: str
    user: str
    state: str  # "idle in transaction", "active"...; empty when hidden
    transaction_started: datetime | None
    transaction_seconds: float | None
    query: str  # its first line, shortened; empty when hidden
    query_hidden: bool


@dataclass
class Blocker:
    """One session, what it holds, and the chunks that wait on it."""

    session: Session
    holds: list[str]
    chunks: list[Chunk]


@dataclass
class Blockers:
    """What blocks a chunk, a run or a policy, as read at ``read_at``."""

    scope: str  # "chunk", "run" or "policy"
    read_at: datetime
    blockers: list[Blocker] = field(default_factory=list)
    # What could not be read, and why: the page never says "nothing" for it.
    notes: list[str] = field(default_factory=list)
    probed: int = 0
    left_out: int = 0
    role: str = ""

    def __bool__(self) -> bool:
        return bool(self.blockers or self.notes)

    @property
    def hidden(self) -> bool:
        return any(blocker.session.query_hidden for blocker in self.blockers)


def for_chunk(chunk: Chunk) -> Blockers | None:
    """The sessions blocking this chunk now; None for a chunk that finished."""
    if chunk.state not in PROBED:
        return None
    return _read(chunk.run.policy, [chunk], scope="chunk")


def for_run(run: Run) -> Blockers | None:
    """The sessions blocking this run's unfinished or dead-lettered chunks now; None if
    it has none."""
    chunks, left_out = _to_probe(Chunk.objects.filter(run=run))
    if not chunks:
        return None
    return _read(run.policy, chunks, left_out, scope="run")


def for_policy(policy_name: str) -> Blockers:
    """The sessions blocking this policy's unfinished or dead-lettered chunks now, and
    the table locks its next chunks would wait for."""
    chunks, left_out = _to_probe(Chunk.objects.filter(run__policy=policy_name))
    return _read(policy_name, chunks, left_out, scope="policy")


def _to_probe(chunks) -> tuple[list[Chunk], int]:
    """The chunks to read, at most MAX_CHUNKS: unfinished ones first, the longest since
    sent first (as the overview counts stalled work), then the latest dead letters."""
    unfinished = (chunks.filter(state__in=Chunk.UNFINISHED).select_related("run")
                  .order_by(Coalesce("enqueued_at", "planned_at"), "pk"))
    chosen = list(unfinished[:MAX_CHUNKS])
    if len(chosen) < MAX_CHUNKS:
        dead = (chunks.filter(state=Chunk.State.DEAD_LETTERED).select_related("run")
                .order_by("-dead_lettered_at", "pk"))
        chosen += list(dead[:MAX_CHUNKS - len(chosen)])
    if len(chosen) < MAX_CHUNKS:
        return chosen, 0
    return chosen, chunks.filter(state__in=PROBED).count() - len(chosen)


class _Found:
    """The blocking sessions found so far, by pid, with what each holds."""

    def __init__(self) -> None:
        self.by_pid: dict[int, tuple[list[str], list[Chunk]]] = {}
        self.notes: list[str] = []

    def add(self, pid: int | None, holds: str, chunks: list[Chunk]) -> None:
        if pid is None:
            # A prepared transaction (two-phase commit) keeps its locks without a session.
            note = f"A prepared transaction holds {holds}: see pg_prepared_xacts."
            self.notes += [note] if note not in self.notes else []
            return
        held, waiting = self.by_pid.setdefault(pid, ([], []))
        if holds not in held:
            held.append(holds)
        waiting += [chunk for chunk in chunks if chunk not in waiting]


def _read(policy_name: str, chunks: list[Chunk], left_out: int = 0, *,
          scope: str) -> Blockers:
    found = Blockers(scope=scope, read_at=timezone.now(), probed=len(chunks),
                     left_out=left_out)
    try:
        policy = get_policy(policy_name)
    except CleanupError:
        found.notes.append(f"No policy named {policy_name} is registered: which table its "
                           "chunks change is unknown.")
        return found
    sessions = _Found()
    try:
        with _bounded() as cursor:
            table = policy.model._meta.db_table
            cursor.execute(_TABLE_LOCKS, [connection.ops.quote_name(table),
                                          CONFLICTING_MODES])
            table_locks = cursor.fetchall()
            for pid, mode, granted in table_locks:
                sessions.add(pid, f"{mode} on {table}" if granted else
                             f"a queued request for {mode} on {table}: the chunks' "
                             "statements queue behind it", chunks)
            working = _working(cursor, chunks, sessions)
            if any(granted and mode == READS_BLOCKED for _, mode, granted in table_locks):
                if chunks:
                    sessions.notes.append(f"The chunks' rows were not read: {table} is "
                                          f"locked {READS_BLOCKED}, so their row locks are "
                                          "unknown until it is released.")
            else:
                _rows(cursor, policy, chunks, working, sessions)
            found.blockers = _blockers(cursor, sessions)
            found.role = _fetch_one(cursor, "SELECT current_user")[0]
    except DatabaseError as exc:
        sessions.notes.append(f"PostgreSQL could not be read: {_first_line(str(exc))}")
    found.notes = sessions.notes
    return found


# Set for the reading's transaction only (a pooled server connection keeps none of it).
_SETTINGS = "SELECT current_setting('statement_timeout'), current_setting('lock_timeout')"
_BOUNDS = ("SELECT set_config('statement_timeout', %s, true), "
           "set_config('lock_timeout', %s, true)")


@contextmanager
def _bounded() -> Iterator:
    """A transaction (a savepoint inside one) whose statements are bounded in time."""
    with transaction.atomic(), connection.cursor() as cursor:
        before = _fetch_one(cursor, _SETTINGS)
        cursor.execute(_BOUNDS, [f"{STATEMENT_TIMEOUT_MS}ms", f"{LOCK_TIMEOUT_MS}ms"])
        yield cursor
        # Inside a caller's transaction, settings set in a savepoint outlive its release.
        cursor.execute(_BOUNDS, list(before))


def _fetch_one(cursor, sql: str, params=()) -> tuple:
    cursor.execute(sql, params)
    return cursor.fetchone()


# Relation oids are per database, and pg_locks covers the whole server.
_TABLE_LOCKS = """
    SELECT lock.pid, lock.mode, lock.granted
    FROM pg_locks lock
    WHERE lock.locktype = 'relation'
      AND lock.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND lock.relation = to_regclass(%s) AND lock.mode = ANY(%s)
      AND lock.pid IS DISTINCT FROM pg_backend_pid()
    ORDER BY lock.granted DESC, lock.pid
"""
# The open transaction whose id a row's xmax holds: each holds an exclusive lock on its
# own id (a subtransaction's too) until it ends; each query below matches on that.
# The session working on each chunk (the holder of its ledger row) and whom it waits for.
_WORKING = f"""
    SELECT chunk.id, lock.pid, pg_blocking_pids(lock.pid)
    FROM "{Chunk._meta.db_table}" chunk JOIN pg_locks lock ON
        lock.locktype = 'transactionid' AND lock.mode = 'ExclusiveLock'
        AND lock.granted AND lock.transactionid::text = chunk.xmax::text
    WHERE chunk.id = ANY(%s) AND chunk.xmax::text <> '0'
"""
_ROW_LOCKERS = """
    SELECT locked.xmax, lock.pid
    FROM unnest(%s::text[]) AS locked(xmax) JOIN pg_locks lock ON
        lock.locktype = 'transactionid' AND lock.mode = 'ExclusiveLock'
        AND lock.granted AND lock.transactionid::text = locked.xmax
"""
# The multixacts that may exist now (their ids below the database's oldest were
# truncated, those past the next are not created yet).
_MULTIXACTS = """
    SELECT datminmxid::text::bigint, mxid_age(datminmxid)
    FROM pg_database WHERE datname = current_database()
"""
# A multixact's open members; one that holds no lock on the policy's table is a
# transaction id that only looked like a multixact's, and is left out.
_SHARED_LOCKERS = """
    WITH member AS (
        SELECT locked.xmax, member.xid::text AS xid, member.mode
        FROM unnest(%s::text[]) AS locked(xmax),
             pg_get_multixact_members(locked.xmax::xid) AS member
    )
    SELECT member.xmax, lock.pid, member.mode
    FROM member JOIN pg_locks lock ON
        lock.locktype = 'transactionid' AND lock.mode = 'ExclusiveLock'
        AND lock.granted AND lock.transactionid::text = member.xid
    WHERE EXISTS (SELECT FROM pg_locks held WHERE held.pid = lock.pid AND held.granted
                  AND held.locktype = 'relation' AND held.relation = to_regclass(%s))
"""
_SESSIONS = """
    SELECT pid, coalesce(nullif(application_name, ''), '(' || backend_type || ')', ''),
           coalesce(usename, ''), coalesce(state, ''), xact_start,
           extract(epoch FROM clock_timestamp() - xact_start), query
    FROM pg_stat_activity
    WHERE pid = ANY(%s) AND pid <> pg_backend_pid()
"""


def _working(cursor, chunks: list[Chunk], sessions: _Found) -> dict[int, int]:
    """The pid working on each chunk now, by chunk pk; what it waits for is added."""
    cursor.execute(_WORKING, [[chunk.pk for chunk in chunks]])
    by_pk = {chunk.pk: chunk for chunk in chunks}
    working = {}
    for pk, pid, waits_for in cursor.fetchall():
        working[pk] = pid
        for blocking in waits_for or ():
            sessions.add(blocking, f"a lock #{by_pk[pk].chunk_id}'s session (pid {pid}) "
                                   "waits for now", [by_pk[pk]])
    return working


def _rows(cursor, policy: Policy, chunks: list[Chunk], working: dict[int, int],
          sessions: _Found) -> None:
    """Add the open transactions that lock or changed the chunks' rows."""
    deadline = time.monotonic() + ROWS_BUDGET_SECONDS
    multixacts = _fetch_one(cursor, _MULTIXACTS)
    for n, chunk in enumerate(chunks):
        if time.monotonic() > deadline:
            sessions.notes.append(f"The rows of {len(chunks) - n} more chunks were not "
                                  f"read: reading took longer than {ROWS_BUDGET_SECONDS:g} s.")
            return
        try:
            with transaction.atomic():
                lockers = _row_lockers(cursor, policy, chunk, multixacts)
        except CleanupError as exc:
            sessions.notes.append(f"The rows of #{chunk.chunk_id} were not read: {exc}")
            continue
        except DatabaseError as exc:
            # Another lock on the table (a queued ALTER TABLE ahead of this SELECT): the
            # next chunks' reads would wait as long.
            more = len(chunks) - n - 1
            sessions.notes.append(
                f"Who holds the rows of #{chunk.chunk_id} is unknown"
                + (f" (and of {more} more chunks, not read)" if more else "")
                + f": reading them ran out of time ({_first_line(str(exc))}).")
            return
        for pid, rows, how in lockers:
            if pid is None or pid != working.get(chunk.pk):  # not its own delivery's
                sessions.add(pid, f"{rows} row{'s' if rows > 1 else ''} of "
                                  f"#{chunk.chunk_id} ({how})", [chunk])


def _row_lockers(cursor, policy: Policy, chunk: Chunk,
                 multixacts: tuple[int, int]) -> list[tuple[int | None, int, str]]:
    """(pid, rows, how) of each open transaction that locks or changed the chunk's
    rows still eligible: the rows its statement would wait for."""
    table = connection.ops.quote_name(policy.model._meta.db_table)
    statement = worker.chunk_statement(policy, messages.parse(chunk.message),
                                       chunk.run.frozen)
    by_xmax = dict(
        statement.order_by()
        .annotate(row_xmax=RawSQL(f"{table}.xmax::text", (), output_field=TextField()))
        .exclude(row_xmax="0").values("row_xmax").annotate(rows=Count("pk"))
        .values_list("row_xmax", "rows"))
    if not by_xmax:
        return []
    cursor.execute(_ROW_LOCKERS, [list(by_xmax)])
    matched = cursor.fetchall()
    found = [(pid, by_xmax[xmax], "locked, or changed and not committed")
             for xmax, pid in matched]
    oldest, age = multixacts
    shared = [xmax for xmax in set(by_xmax) - {xmax for xmax, _ in matched}
              if (int(xmax) - oldest) % 2**32 < age]
    if shared:
        cursor.execute(_SHARED_LOCKERS, [shared, table])
        found += [(pid, by_xmax[xmax], f"locked with others: {SHARED_MODES.get(mode, mode)}")
                  for xmax, pid, mode in cursor.fetchall()]
    return found


def _blockers(cursor, sessions: _Found) -> list[Blocker]:
    """The sessions found, as pg_stat_activity has them now, the oldest transaction
    first; one that ended meanwhile is left out."""
    if not sessions.by_pid:
        return []
    cursor.execute(_SESSIONS, [list(sessions.by_pid)])
    found = []
    for pid, application, user, state, started, seconds, query in cursor.fetchall():
        line, hidden = query_line(query)
        held, chunks = sessions.by_pid[pid]
        found.append(Blocker(
            Session(pid, application, user, state, started,
                    None if seconds is None else float(seconds), line, hidden),
            held, sorted(chunks, key=lambda chunk: (str(chunk.run_id), chunk.chunk_id))))
    return sorted(found, key=lambda blocker: -(blocker.session.transaction_seconds or -1))


def query_line(query: str | None) -> tuple[str, bool]:
    """A session's query as the console shows it: its first line, shortened, and
    whether the console's role may not see it (another role's session, read without
    pg_read_all_stats)."""
    if query == HIDDEN:
        return "", True
    line = _first_line(query or "")
    return (line if len(line) <= QUERY_LINE else line[:QUERY_LINE - 1] + "…"), False


def _first_line(text: str) -> str:
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return "".join(c if c.isprintable() else " " for c in line)
