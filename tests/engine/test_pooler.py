"""The engine behind a real PgBouncer in transaction mode, as deployments run it: a
small pool, other clients churning through it, a qcluster and the commands connected
through it. A --sync run killed or frozen mid-run is finished by the cluster, a frozen
process's row locks are released within the documented bound, a halted policy goes on
by itself once its pressure clears, a pause halts and a resume lets go, and no
session-level lock is ever left on a pooled server connection.

transaction=True: the subprocesses and the test see each other's commits.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from django.db import connection
from django.utils import timezone
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from cleanup.models import Chunk, Halt, Run
from tests.conftest import ROOT, wait_for
from tests.engine_app.factories import AccountFactory, LeaseFactory
from tests.engine_app.models import Lease
from tests.pooler import Churn, env_through, pooler_advisory_locks, session_level_locks, started

pytestmark = [pytest.mark.pooler, pytest.mark.qcluster, pytest.mark.django_db(transaction=True)]

POLICY = "expire-leases"
# What the subprocesses run with: small fixed chunks, a short claim on a --sync process's
# messages, short timeouts, and a host indicator an operator-like flag file turns to HOLD.
SETTINGS = """
import os
import signal
import time
from pathlib import Path

from tests.settings import *  # noqa: F403

from cleanup import faults

LEASES_EXPIRE_CHUNK_SIZE = 20
CLEANUP_CHUNK_BUDGET_MS = 0
CLEANUP_WINDOW = 3
CLEANUP_LOCK_TIMEOUT_MS = 500
CLEANUP_SYNC_CLAIM_SECONDS = {claim}
CLEANUP_IDLE_IN_TRANSACTION_TIMEOUT_MS = {idle_ms}
CLEANUP_PRESSURE_CHECK_SECONDS = 0.5
CLEANUP_PRESSURE_INDICATORS = ["pooler_settings.flag_file"]


def flag_file(policy, connection):
    from cleanup.engine.pressure import Level, Signal

    if Path(os.environ["HOLD_FLAG"]).exists():
        return Signal(Level.HALT, "maintenance_flag", 1, 0, "the flag file is there")
    return Signal(Level.OK, "maintenance_flag", 0, 0, "no flag file")


if os.environ.get("SLOW_CHUNK_SECONDS"):
    # Kept referenced: a context manager left to the garbage collector would close,
    # and take its fault out again.
    _slow = faults.injected(faults.BEFORE_COMMIT,
                            lambda: time.sleep(float(os.environ["SLOW_CHUNK_SECONDS"])))
    _slow.__enter__()

_applied = []


def _freeze_at_chunk():
    # SIGSTOP inside the chunk's transaction, after its DELETE: a process that froze
    # (a paused VM, a stuck host) while holding learners' rows.
    _applied.append(1)
    if len(_applied) == int(os.environ["FREEZE_AT_CHUNK"]):
        os.kill(os.getpid(), signal.SIGSTOP)


if os.environ.get("FREEZE_AT_CHUNK"):
    _freeze = faults.injected(faults.BEFORE_COMMIT, _freeze_at_chunk)
    _freeze.__enter__()
"""
CLAIM_SECONDS = 4
IDLE_MS = 2_000
QCLUSTER_ENV = {"Q_TIMEOUT": "8", "Q_RETRY": "10", "Q_POLL": "0.1", "Q_WORKERS": "2",
                "DATABASE_POOLER": "transaction"}


@pytest.fixture
def pooled(tmp_path):
    """A PgBouncer (pool of 4) in front of the test database, four other clients
    churning through it, and the environment of a subprocess connected through it."""
    (tmp_path / "pooler_settings.py").write_text(
        SETTINGS.format(claim=CLAIM_SECONDS, idle_ms=IDLE_MS))
    name = connection.settings_dict["NAME"]
    with started(pool_size=4) as pooler, Churn(pooler, name, clients=4, max_seconds=600):
        env = env_through(pooler, name, DJANGO_SETTINGS_MODULE="pooler_settings",
                          PYTHONPATH=str(tmp_path), HOLD_FLAG=str(tmp_path / "hold"),
                          **QCLUSTER_ENV)
        yield Pooled(pooler, env, tmp_path)
        # Whatever happened, nothing session-scoped is left on a server connection.
        direct = pooler.direct_url(name)
        assert pooler_advisory_locks(pooler, direct) == []
        assert session_level_locks(direct, name) == []


class Pooled:
    def __init__(self, pooler, env: dict, folder: Path):
        self.pooler, self.env, self.folder = pooler, env, folder
        self.processes: list[subprocess.Popen] = []

    def manage(self, *args: str, **env: str) -> subprocess.Popen:
        log = (self.folder / f"{args[0]}-{len(self.processes)}.log").open("w")
        process = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), *args], cwd=ROOT,
                                   env={**self.env, **env}, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        self.processes.append(process)
        return process

    def run(self, *args: str) -> str:
        result = subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], cwd=ROOT,
                                env=self.env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    def output(self, process: subprocess.Popen) -> str:
        return (self.folder / f"{process.args[2]}-{self.processes.index(process)}.log").read_text()

    def stop_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture
def cluster_and_commands(pooled):
    yield pooled
    pooled.stop_all()


def backlog(expired: int = 2000) -> tuple[list, list]:
    account = AccountFactory()
    now = timezone.now()
    Lease.objects.bulk_create(
        Lease(account=account, holder=f"holder-{i}", expires_at=now - timedelta(hours=1, seconds=i))
        for i in range(expired))
    renewed = LeaseFactory.create_batch(20, account=account)  # expire in the future
    kept = LeaseFactory.create_batch(20, account=account, state=Lease.State.KEPT, expired=True)
    return renewed, kept


def the_ledger_equals_reality(run: Run, spared: list) -> None:
    run.refresh_from_db()
    chunks = list(run.chunks.all())
    assert run.state == Run.State.COMPLETED
    assert {c.state for c in chunks} <= set(Chunk.DONE)
    # Every row counted deleted is gone, once: no chunk applied or counted twice.
    assert sum(c.rows_deleted for c in chunks) == run.eligible_at_dispatch
    assert set(Lease.objects.values_list("pk", flat=True)) == {lease.pk for lease in spared}


def stopped(process: subprocess.Popen) -> bool:
    """Whether the process is stopped by a signal (state T in /proc)."""
    stat = Path(f"/proc/{process.pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


def the_run() -> Run | None:
    return Run.objects.filter(policy=POLICY).order_by("-created_at").first()


def held_locks(run: Run) -> list:
    """The locks of the run's messages in the queue."""
    return [row.lock for row in OrmQ.objects.all()
            if SignedPackage.loads(row.payload)["args"][0]["run_id"] == str(run.pk)]


def first_commit_after(run: Run, moment):
    return (run.chunks.filter(committed_at__gt=moment).order_by("committed_at")
            .values_list("committed_at", flat=True).first())


def test_a_sync_run_killed_behind_the_pooler_is_finished_by_the_cluster(cluster_and_commands):
    pooled = cluster_and_commands
    renewed, kept = backlog()
    pooled.run("cleanup_schedule")
    sync = pooled.manage("cleanup_dispatch", "--policy", POLICY, "--sync",
                         SLOW_CHUNK_SECONDS="0.1")
    wait_for(lambda: Chunk.objects.filter(state__in=Chunk.DONE).count() >= 3, timeout=60,
             interval=0.02, what="a few chunks committed by the --sync process")
    sync.send_signal(signal.SIGKILL)
    killed = timezone.now()
    sync.wait(10)
    run = the_run()
    assert run.state == Run.State.RUNNING
    # Its messages are all in the queue, taken by the dead process until their claim lapses.
    held = held_locks(run)
    assert held and min(held) > killed
    lapses = min(held)

    pooled.manage("qcluster")
    wait_for(lambda: Run.objects.get(pk=run.pk).state == Run.State.COMPLETED, timeout=180,
             interval=0.5, what="the cluster to finish the run")

    the_ledger_equals_reality(run, renewed + kept)
    first = first_commit_after(run, killed)
    assert first >= lapses  # not one message taken before its claim lapsed
    took_over = (first - killed).total_seconds()
    assert CLAIM_SECONDS - 1 <= took_over <= CLAIM_SECONDS + 30
    print(f"\nkilled --sync run behind the pooler: first chunk committed by the cluster "
          f"{took_over:.2f} s after the kill (claim {CLAIM_SECONDS} s), run finished "
          f"{(run.finished_at - killed).total_seconds():.1f} s after it")


def test_a_sync_run_frozen_behind_the_pooler_releases_its_rows_and_the_cluster_finishes_it(
        cluster_and_commands):
    pooled = cluster_and_commands
    renewed, kept = backlog()
    pooled.run("cleanup_schedule")
    pooled.manage("qcluster")
    sync = pooled.manage("cleanup_dispatch", "--policy", POLICY, "--sync", FREEZE_AT_CHUNK="3")
    wait_for(lambda: stopped(sync), timeout=60, what="the --sync process to freeze mid-chunk")
    frozen = timezone.now()
    frozen_at = time.monotonic()
    run = the_run()
    frozen_chunk = run.chunks.get(chunk_id=3)
    learner_row = frozen_chunk.message["items"][0][0]

    # A learner renewing a hold the frozen chunk deleted waits, until the server ends
    # the frozen session (idle in transaction): the row was never deleted.
    with psycopg.connect(pooled.pooler.direct_url(connection.settings_dict["NAME"]),
                         autocommit=True) as learner:
        learner.execute("SET lock_timeout = '100ms'")  # this probe's own session

        def renewed_the_row() -> bool:
            try:
                return learner.execute(
                    "UPDATE engine_app_lease SET expires_at = expires_at WHERE id = %s "
                    "RETURNING 1", [learner_row]).fetchone() is not None
            except psycopg.errors.LockNotAvailable:
                return False

        assert not renewed_the_row()
        wait_for(renewed_the_row, timeout=IDLE_MS / 1000 + 10, interval=0.1,
                 what="the frozen session's locks to be released")
    released = time.monotonic() - frozen_at

    # The cluster gets the frozen process's messages once their claim lapses.
    wait_for(lambda: Run.objects.get(pk=run.pk).state == Run.State.COMPLETED, timeout=180,
             interval=0.5, what="the cluster to finish the run")
    took_over = (first_commit_after(run, frozen) - frozen).total_seconds()
    print(f"\nfrozen --sync run behind the pooler: rows released {released:.1f} s after it "
          f"froze, first chunk committed by the cluster {took_over:.2f} s after")
    assert took_over >= CLAIM_SECONDS - 1  # its messages were taken just before
    the_ledger_equals_reality(run, renewed + kept)
    counted = Chunk.objects.get(pk=frozen_chunk.pk)

    # The frozen process wakes up late: it applies and counts nothing more.
    sync.send_signal(signal.SIGCONT)
    assert sync.wait(60) == 0, pooled.output(sync)
    the_ledger_equals_reality(run, renewed + kept)
    assert Chunk.objects.get(pk=frozen_chunk.pk).rows_deleted == counted.rows_deleted
    output = pooled.output(sync)
    # Chunks #1 and #2 are its own; #3, rolled back by the server, the cluster's.
    assert ("applied here: 40 rows deleted in 2 chunks (the run's chunks: 2,000 of 2,000 "
            "rows deleted in all)") in output, output
    assert released <= IDLE_MS / 1000 + 3


def test_a_held_policy_goes_on_by_itself_once_the_pressure_clears_three_times(
        cluster_and_commands):
    pooled = cluster_and_commands
    flag = Path(pooled.env["HOLD_FLAG"])
    pooled.manage("qcluster")
    waits = []
    for _ in range(3):
        renewed, kept = backlog(200)
        flag.touch()
        pooled.run("cleanup_dispatch", "--policy", POLICY)
        run = the_run()
        wait_for(lambda: Halt.objects.filter(policy=POLICY, reason="maintenance_flag",
                                             ended_at__isnull=True).exists(),
                 timeout=30, what="the policy to be halted")
        time.sleep(2)  # halted: nothing of the run is planned meanwhile
        assert run.chunks.count() == 0
        flag.unlink()
        cleared = time.monotonic()
        wait_for(lambda run=run: Run.objects.get(pk=run.pk).state == Run.State.COMPLETED,
                 timeout=60, interval=0.2, what="the run to go on by itself")
        waits.append(time.monotonic() - cleared)
        the_ledger_equals_reality(run, renewed + kept)
        Lease.objects.all().delete()
    assert not Halt.objects.filter(policy=POLICY, ended_at__isnull=True).exists()
    print("\nhalted policy behind the pooler went on "
          + ", ".join(f"{wait:.1f} s" for wait in waits) + " after its pressure cleared")


def test_a_pause_holds_and_a_resume_lets_go_behind_the_pooler(cluster_and_commands):
    pooled = cluster_and_commands
    renewed, kept = backlog(400)
    pooled.manage("qcluster")
    pooled.run("cleanup_pause", "--policy", POLICY, "--reason", "migrating the table")
    pooled.run("cleanup_dispatch", "--policy", POLICY)
    run = the_run()
    time.sleep(2)
    assert run.chunks.count() == 0 and Run.objects.get(pk=run.pk).state == Run.State.RUNNING

    pooled.run("cleanup_resume", "--policy", POLICY)
    wait_for(lambda: Run.objects.get(pk=run.pk).state == Run.State.COMPLETED, timeout=60,
             interval=0.2, what="the run to finish once resumed")
    the_ledger_equals_reality(run, renewed + kept)
