"""A run halted by a standby that stopped replaying, and let go once it replays again.

Real parts throughout, driven as an operator would: a throwaway primary with a streaming
standby (tests/standby.py), ``manage.py`` subprocesses on a database of the primary, and a
django-q2 qcluster doing the work. The run's first window is sent before the standby
falls behind, so the halt is met where a running run meets it: at the end of a chunk.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from tests.conftest import ROOT, subprocess_env, wait_for
from tests.engine.test_pressure import standby_pair  # noqa: F401 - the session's primary and standby

DATABASE = "cleanup_pressure"
EXPIRED, ACTIVE = 20_000, 100
LAG_LIMIT = 1.0
CHECK_SECONDS = 0.5
# Looked at for this long once halted: six pressure checks in each worker.
HELD_FOR = 3.0
TIMEOUT = 30.0
ENV = {
    "DJANGO_SETTINGS_MODULE": "tests.settings",
    "CLEANUP_MAX_REPLICA_LAG": f"{LAG_LIMIT:g}",
    "CLEANUP_PRESSURE_CHECK_SECONDS": f"{CHECK_SECONDS:g}",
    "Q_WORKERS": "2",
    "Q_POLL": "0.1",
}


def max_replay_lag(primary: psycopg.Connection) -> float:
    """The primary's view of its standby's replay lag in seconds (0 when idle)."""
    (lag,) = primary.execute("SELECT coalesce(max(extract(epoch FROM replay_lag)), 0) "
                             "FROM pg_stat_replication").fetchone()
    return float(lag)


class Operator:
    """``manage.py`` on the primary's cleanup database, and the qcluster's log."""

    def __init__(self, database_url: str, log: Path) -> None:
        self.env = subprocess_env(DATABASE_URL=database_url, **ENV)
        self.log = log

    def run(self, *args: str) -> str:
        done = subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], cwd=ROOT,
                              env=self.env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"manage.py {' '.join(args)} exited " \
                                     f"{done.returncode}:\n{done.stdout}{done.stderr}"
        return done.stdout

    def json(self, *args: str) -> dict:
        return json.loads(self.run(*args, "--json"))

    def qcluster(self) -> subprocess.Popen:
        with self.log.open("w") as output:
            return subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "qcluster"],
                                    cwd=ROOT, env=self.env, stdout=output,
                                    stderr=subprocess.STDOUT, text=True)

    def within(self, predicate, what: str, timeout: float = TIMEOUT):
        """``wait_for``, with the qcluster's last lines when it times out."""
        try:
            return wait_for(predicate, timeout=timeout, interval=0.1, what=what)
        except AssertionError as exc:
            tail = self.log.read_text()[-4000:] if self.log.exists() else "(no qcluster log)"
            raise AssertionError(f"{exc}\n--- qcluster output\n{tail}") from None


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def cleanup_database(standby_pair):  # noqa: F811 - the imported fixture
    """A new database on the primary; its URL, and an autocommit connection to it."""
    with psycopg.connect(**standby_pair.conninfo(standby_pair.primary_port),
                         autocommit=True) as server:
        server.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        server.execute(f"CREATE DATABASE {DATABASE}")
    url = f"postgres://{standby_pair.user}@{standby_pair.host}:{standby_pair.primary_port}" \
          f"/{DATABASE}"
    with psycopg.connect(**standby_pair.conninfo(standby_pair.primary_port, DATABASE),
                         autocommit=True) as primary:
        yield url, primary


@pytest.mark.qcluster
def test_paused_replay_holds_the_run_after_its_window_and_resuming_finishes_it(
        standby_pair, cleanup_database, tmp_path):  # noqa: F811 - the imported fixture
    url, primary = cleanup_database
    operator = Operator(url, tmp_path / "qcluster.log")
    operator.run("migrate", "--verbosity", "0")
    operator.run("seed_reservations", "--tenants", "2", "--expired", str(EXPIRED),
                 "--active", str(ACTIVE), "--reminders", "0")
    primary.execute("CREATE TABLE writes (id serial PRIMARY KEY)")
    standby = psycopg.connect(**standby_pair.conninfo(standby_pair.standby_port),
                              autocommit=True)
    cluster = None
    try:
        # The standby keeps up: the run's first window is planned and sent, and no worker
        # has taken it yet.
        assert max_replay_lag(primary) <= LAG_LIMIT
        dispatched = operator.json("cleanup_dispatch", "--policy", "expire-holds")
        run_id, window = dispatched["run_id"], dispatched["first_chunks"]
        assert window == 4

        def chunks(*, unfinished: bool = False) -> int:
            """The run's chunks planned so far (those still in flight)."""
            return primary.execute(
                "SELECT count(*) FILTER (WHERE NOT %s OR state IN ('planned', 'enqueued', "
                "'retrying')) FROM cleanup_chunk WHERE run_id = %s",
                [unfinished, run_id]).fetchone()[0]

        def open_halt():
            return primary.execute(
                "SELECT reason, value, \"limit\", detail, actor FROM cleanup_halt "
                "WHERE policy = 'expire-holds' AND ended_at IS NULL").fetchall()

        assert not open_halt()

        # Then it stops replaying, and writes on the primary leave it behind.
        standby.execute("SELECT pg_wal_replay_pause()")
        paused = time.monotonic()

        def lagging() -> float:
            primary.execute("INSERT INTO writes DEFAULT VALUES")
            return (lag := max_replay_lag(primary)) > LAG_LIMIT and lag

        lag_seen = operator.within(lagging, "the replay lag to pass the limit")
        lag_after = time.monotonic() - paused

        cluster = operator.qcluster()
        started = time.monotonic()
        # The window's chunks finish; each one's end reads the lag and plans nothing.
        operator.within(lambda: lagging() and open_halt() and not chunks(unfinished=True),
                        "a replica_lag halt with nothing in flight")
        to_halt = time.monotonic() - started
        at_halt = chunks()
        held_until = time.monotonic() + HELD_FOR
        while time.monotonic() < held_until:
            lagging()
            time.sleep(0.1)

        [(reason, value, limit, detail, actor)] = open_halt()
        assert (reason, limit, actor) == ("replica_lag", LAG_LIMIT, "engine")
        assert value > LAG_LIMIT
        assert detail.startswith(f"replica lag {value:.1f} s > 1 s")
        assert at_halt == chunks() == window
        status = operator.json("cleanup_status", run_id)
        assert status["state"] == "running"
        assert status["chunks_planned"] == window
        assert status["rows_deleted"] == dispatched["first_rows"] < EXPIRED
        assert len(status["halted"]) == 1 and "replica lag" in status["halted"][0], status["halted"]
        assert re.search(r"^  halted [^:]+: replica lag \d+\.\d s > 1 s \(1 standby connection\): "
                         r"nothing new is planned until it is resumed$",
                         operator.run("cleanup_status", run_id), re.MULTILINE)
        held_at_lag = value

        standby.execute("SELECT pg_wal_replay_resume()")
        resumed = time.monotonic()
        operator.within(lambda: primary.execute(
            "SELECT state <> 'running' FROM cleanup_run WHERE id = %s", [run_id]).fetchone()[0],
            "the run to finish once replay resumed")
        to_finish = time.monotonic() - resumed
    finally:
        if cluster is not None:
            stop(cluster)
        # Whatever failed, the session's standby is left replaying.
        standby.execute("SELECT pg_wal_replay_resume()")
        standby.close()

    run_state, cutoff = primary.execute(
        "SELECT state, cutoff FROM cleanup_run WHERE id = %s", [run_id]).fetchone()
    assert run_state == "completed", operator.log.read_text()[-4000:]
    assert primary.execute(
        "SELECT reason, ended_by FROM cleanup_halt WHERE policy = 'expire-holds'"
    ).fetchall() == [("replica_lag", "engine")]
    # The ledger equals reality: every expired hold deleted once, counted once, and
    # nothing else touched.
    (deleted,) = primary.execute("SELECT sum(rows_deleted) FROM cleanup_chunk WHERE run_id = %s",
                                 [run_id]).fetchone()
    assert deleted == EXPIRED
    assert primary.execute(
        "SELECT count(*) FILTER (WHERE status = 'held' AND expires_at <= %s), count(*) "
        "FROM reservations_seathold", [cutoff]).fetchone() == (0, ACTIVE)
    assert primary.execute(
        "SELECT array_agg(DISTINCT state) FROM cleanup_chunk WHERE run_id = %s",
        [run_id]).fetchone()[0] == ["acknowledged"]
    status = operator.json("cleanup_status", run_id)
    assert (status["halted"], status["rows_deleted"]) == ([], EXPIRED)
    print(f"\nreplay paused: lag {lag_seen:.2f} s > {LAG_LIMIT:g} s after {lag_after:.1f} s; "
          f"halted {to_halt:.1f} s after the qcluster started, at {at_halt} chunks "
          f"(window {window}), lag {held_at_lag:.2f} s; finished {to_finish:.1f} s after "
          f"replay resumed, {status['chunks_planned']} chunks, {deleted:,} rows deleted")
