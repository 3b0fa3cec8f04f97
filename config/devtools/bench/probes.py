"""Learners renewing holds while a contender cleans, each renewal timed; how long a
vacuum worked on the tables meanwhile; the queue's processes' peak memory; and the WAL
the server wrote."""

from __future__ import annotations

import random
import threading
import time
from datetime import timedelta
from pathlib import Path

from django.db import connection
from django.utils import timezone

from reservations.conf import conf
from reservations.models import SeatHold

# Renewals per second per probe is about 1 / (PAUSE + the renewal's own time).
PAUSE = 0.01
CLEANED, UNTOUCHED = "cleaned", "untouched"


class RenewalProbe(threading.Thread):
    """Renew random holds of a fixed sample on its own connection until stopped.

    A renewal here is the row work of ``services.renew_hold``: lock the hold, move its
    expiry. The service's capacity count for an expired hold is left out, so the time
    measured is the wait for the row and not a section-wide count.
    """

    def __init__(self, kind: str, ids: list[int], seed: int):
        super().__init__(name=f"renewals-{kind}", daemon=True)
        self.kind = kind
        self.ids = ids
        self.rng = random.Random(seed)
        self.latencies: list[float] = []
        self.renewed: set[int] = set()
        self.error: BaseException | None = None
        self._stopping = threading.Event()

    def run(self) -> None:
        try:
            # An empty sample renews nothing (no hold of its kind was left to draw from):
            # its summary then counts no renewal.
            while self.ids and not self._stopping.is_set():
                self._renew_one(self.rng.choice(self.ids))
                self._stopping.wait(PAUSE)
        except BaseException as exc:  # reported by the runner, not lost with the thread
            self.error = exc
        finally:
            connection.close()

    def stop(self) -> None:
        self._stopping.set()
        self.join()

    def _renew_one(self, pk: int) -> None:
        started = time.perf_counter()
        # One UPDATE in its own transaction: it takes the row lock, or waits for it.
        found = SeatHold.objects.filter(pk=pk, status=SeatHold.Status.HELD).update(
            expires_at=timezone.now() + timedelta(minutes=conf.HOLD_MINUTES)
        )
        self.latencies.append(time.perf_counter() - started)
        if found:
            self.renewed.add(pk)


class VacuumProbe(threading.Thread):
    """Sample every ``every`` seconds, on its own connection, which of the tables a vacuum
    (manual or automatic) is working on; ``seconds`` sums the samples per table.

    The pipeline slows down while one works on the policy's table (the vacuum
    indicator): a run that met autovacuum is slower for it, and this says so. An
    autovacuum's table shows only to a superuser or a member of pg_read_all_stats, as
    for the indicator itself.
    """

    def __init__(self, tables: list[str], every: float = 0.1):
        super().__init__(name="vacuum-probe", daemon=True)
        self.tables = tables
        self.every = every
        self.seconds = dict.fromkeys(tables, 0.0)
        self.error: BaseException | None = None
        self._stopping = threading.Event()

    def run(self) -> None:
        try:
            with connection.cursor() as cursor:
                while not self._stopping.wait(self.every):
                    cursor.execute(
                        "SELECT relid::regclass::text FROM pg_stat_progress_vacuum"
                        " WHERE datid = (SELECT oid FROM pg_database"
                        "                WHERE datname = current_database())")
                    for (table,) in cursor.fetchall():
                        if table in self.seconds:
                            self.seconds[table] += self.every
        except BaseException as exc:  # reported by the runner, not lost with the thread
            self.error = exc
        finally:
            connection.close()

    def stop(self) -> dict[str, float]:
        self._stopping.set()
        self.join()
        return {table: round(seconds, 1) for table, seconds in self.seconds.items()}


class MemoryProbe(threading.Thread):
    """Sample every ``every`` seconds the resident memory of each process ``pids()``
    names; ``stop`` returns the largest any one of them reached, in MB (a worker's, not
    their sum: a worker that grows with the backlog shows, however many there are)."""

    def __init__(self, pids, every: float = 0.5):
        super().__init__(name="memory-probe", daemon=True)
        self.pids = pids
        self.every = every
        self.peak_kb = 0
        self.error: BaseException | None = None
        self._stopping = threading.Event()

    def run(self) -> None:
        try:
            while True:
                for pid in self.pids():
                    self.peak_kb = max(self.peak_kb, memory_kb(pid, "VmRSS"))
                if self._stopping.wait(self.every):
                    return
        except BaseException as exc:  # reported by the runner, not lost with the thread
            self.error = exc

    def stop(self) -> float | None:
        self._stopping.set()
        self.join()
        return round(self.peak_kb / 1024, 1) if self.peak_kb else None


def memory_kb(pid: int, field: str) -> int:
    """A memory figure of the process from /proc (``VmRSS``: resident now, ``VmHWM``: its
    peak), in kB; 0 if the process is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0


def sample_ids(*, expired: bool, size: int, seed: int) -> list[int]:
    """Ids of held holds, expired by now or not, drawn at random."""
    now = timezone.now()
    rows = SeatHold.objects.filter(status=SeatHold.Status.HELD)
    rows = rows.filter(expires_at__lte=now) if expired else rows.filter(expires_at__gt=now)
    ids = list(rows.values_list("pk", flat=True))
    random.Random(seed).shuffle(ids)
    return ids[:size]


def summary(latencies: list[float]) -> dict:
    if not latencies:
        return {"n": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    ordered = sorted(latencies)
    return {
        "n": len(ordered),
        "p50_ms": round(percentile(ordered, 50) * 1000, 2),
        "p99_ms": round(percentile(ordered, 99) * 1000, 2),
        "max_ms": round(ordered[-1] * 1000, 2),
    }


def percentile(ordered: list[float], pct: float) -> float:
    """The nearest-rank percentile of an ascending list."""
    rank = max(1, -(-len(ordered) * pct // 100))
    return ordered[int(rank) - 1]


def wal_position() -> str:
    """The server's current WAL write position, ``pg_current_wal_lsn()``."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_lsn()::text")
        return cursor.fetchone()[0]


def wal_written(since: str) -> int:
    """Bytes of WAL the server wrote since the position ``since``: every database's and
    every session's (PostgreSQL 15 counts WAL for the whole server only), full-page
    images included."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)::bigint",
                       [since])
        return cursor.fetchone()[0]


# The ledger's functions (cleanup/sql) a pipeline's chunks call: with their statements
# inside them, a statement's time is the function's (pg_stat_user_functions, counted
# where ``track_functions`` is 'pl' or 'all').
LEDGER_FUNCTIONS = "cleanup\\_%\\_v_"


def track_functions(on: bool) -> bool:
    """Count the time of every PL/pgSQL function called in the database (``on``), or stop
    (a setting of the database, which the queue's processes read when they connect);
    False if it could not be set (it takes a superuser)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        if not cursor.fetchone()[0]:
            return False
        name = connection.ops.quote_name(connection.settings_dict["NAME"])
        cursor.execute(f"ALTER DATABASE {name} SET track_functions = 'pl'" if on
                       else f"ALTER DATABASE {name} RESET track_functions")
    return True


def function_times() -> dict[str, tuple[int, float, float]]:
    """Each ledger function's calls, total and self time in ms so far, as the server's
    statistics have them (each backend adds its own when it goes idle)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT funcname, calls, total_time, self_time "
                       "FROM pg_stat_user_functions WHERE funcname LIKE %s", [LEDGER_FUNCTIONS])
        return {name: (calls, total, own) for name, calls, total, own in cursor.fetchall()}


def function_times_since(before: dict) -> dict[str, dict]:
    """What each ledger function was called for since ``before``: its calls, and the
    milliseconds a call took (its total, and its own without the functions it called)."""
    spent = {}
    for name, (calls, total, own) in function_times().items():
        calls0, total0, own0 = before.get(name, (0, 0.0, 0.0))
        if calls > calls0:
            spent[name] = {"calls": calls - calls0,
                           "ms_per_call": round((total - total0) / (calls - calls0), 3),
                           "self_ms_per_call": round((own - own0) / (calls - calls0), 3)}
    return spent
