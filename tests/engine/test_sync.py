"""A --sync run is dispatched like any other and its messages go to the queue; the
process applies the run as one more worker of it. With the ORM broker the messages of
the run it applies are written already taken (their lock CLEANUP_SYNC_CLAIM_SECONDS
ahead, as a worker's dequeue leaves a row) and each goes once its chunk committed. When
the process stops early it gives back what it holds at once; when it is killed or
frozen the workers get its messages once their claim lapses. Another broker cannot hold
a message back: a worker that gets one the process applied finds nothing to do."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from datetime import timedelta
from io import StringIO
from pathlib import Path

import psycopg
import pytest
from django.core.management import call_command
from django.db import OperationalError, connection
from django.utils import timezone
from django_q.conf import Conf
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from cleanup import faults
from cleanup.engine import leases, transitions, transport
from cleanup.engine.dispatch import dispatch, dispatch_in_process
from cleanup.engine.worker import Outcome, apply_chunk
from cleanup.models import Chunk, Run
from tests.conftest import ROOT, SCRATCH_REDIS_URL, database_url, manage, subprocess_env, wait_for
from tests.engine_app.factories import AccountFactory, LeaseFactory
from tests.engine_app.models import Lease

LOCK_TIMEOUT = "OperationalError: canceling statement due to lock timeout"
# How far behind its claim a taken row's lock may read: the time since it was sent.
A_LITTLE = timedelta(seconds=5)


def queued_messages() -> list[dict]:
    return [SignedPackage.loads(q.payload)["args"][0] for q in OrmQ.objects.order_by("id")]


def unfinished(run: Run) -> list[Chunk]:
    return list(run.chunks.filter(state__in=Chunk.UNFINISHED).order_by("chunk_id"))


def assert_deliverable_now() -> None:
    """Every message in the queue is a worker's to take at once: nothing is held."""
    locks = list(OrmQ.objects.values_list("lock", flat=True))
    assert locks and max(locks) <= timezone.now()


@pytest.fixture
def backlog(db, settings, chunk_size):
    """Six expired leases in chunks of one, two in flight."""
    settings.CLEANUP_WINDOW = 2
    chunk_size("expire-leases", 1)
    return LeaseFactory.create_batch(6, account=AccountFactory(), expired=True)


@pytest.mark.django_db
def test_a_sync_runs_messages_are_written_taken_and_go_as_their_chunks_commit(backlog,
                                                                              settings):
    settings.CLEANUP_SYNC_CLAIM_SECONDS = 120
    claim = timedelta(seconds=120)
    seen = []

    def queue_after_each_chunk(chunks, rows, eligible):
        run = Run.objects.get()
        rows_now = list(OrmQ.objects.order_by("id"))
        # The queue holds exactly the run's unfinished chunks, each taken for the claim.
        assert queued_messages() == [c.message for c in unfinished(run)]
        assert all(row.lock >= timezone.now() + claim - A_LITTLE for row in rows_now)
        seen.append(len(rows_now))

    run = dispatch_in_process("expire-leases", progress=queue_after_each_chunk).run

    assert seen == [2, 2, 2, 2, 1, 0]
    run.refresh_from_db()
    assert run.state == Run.State.COMPLETED and run.messages_sent == 6
    # Sent like any run's, each message acknowledged once its chunk committed.
    chunks = list(run.chunks.all())
    assert all(c.enqueued_at is not None for c in chunks)
    assert {c.state for c in chunks} == {Chunk.State.ACKNOWLEDGED}
    assert OrmQ.objects.count() == 0 and Lease.objects.count() == 0


@pytest.mark.django_db
def test_under_django_q_sync_mode_nothing_is_sent_for_a_run_applied_here(
        backlog, q_sync, monkeypatch, django_capture_on_commit_callbacks):
    sent = []
    real_send = transport.async_task
    monkeypatch.setattr(transport, "async_task",
                        lambda *args, **kwargs: sent.append(args) or real_send(*args, **kwargs))

    # Sync mode runs a message sent once its transaction commits: run those callbacks.
    with django_capture_on_commit_callbacks(execute=True):
        run = dispatch_in_process("expire-leases").run

    run.refresh_from_db()
    assert run.state == Run.State.COMPLETED and Lease.objects.count() == 0
    assert sent == [] and OrmQ.objects.count() == 0


def leases_in_expiry_order(count: int) -> list[Lease]:
    """Expired leases one second apart: items chunks take them in this order."""
    account = AccountFactory()
    now = timezone.now()
    return [LeaseFactory(account=account, expires_at=now - timedelta(hours=1, seconds=count - i))
            for i in range(count)]


def table_locked_elsewhere() -> psycopg.Connection:
    """A second real connection keeping the leases from being deleted (a migration's
    lock of the table): a lock no skipping of locked rows gets past."""
    holder = psycopg.connect(database_url())
    holder.execute(f"LOCK TABLE {Lease._meta.db_table} IN SHARE MODE")
    return holder


def assert_left_to_the_queue_with_chunk_retrying(run: Run, failed: int) -> None:
    run.refresh_from_db()
    assert run.state == Run.State.RUNNING
    chunk = run.chunks.get(chunk_id=failed)
    assert (chunk.state, chunk.cause) == (Chunk.State.RETRYING, LOCK_TIMEOUT)
    left = unfinished(run)
    assert {c.state for c in left if c.chunk_id != failed} <= {Chunk.State.ENQUEUED}
    # Every unfinished chunk's message is in the queue, the retrying one's too, and
    # none of them waits for a claim to lapse.
    assert queued_messages() == [c.message for c in left]
    assert_deliverable_now()


def finish_from_the_queue(run: Run) -> None:
    """Deliver what the queue holds, as a worker would, until the run completes."""
    while messages := queued_messages():
        OrmQ.objects.all().delete()
        for message in messages:
            apply_chunk(message)
    run.refresh_from_db()
    assert run.state == Run.State.COMPLETED


# transaction=True: the lock is held from a second real connection, which must see the
# leases the test committed (and the subprocess below must see them too).
@pytest.mark.django_db(transaction=True)
def test_a_sync_chunk_locked_past_the_in_task_retries_gives_the_rest_to_the_queue(
        settings, chunk_size):
    settings.CLEANUP_TRANSIENT_RETRIES = 1
    chunk_size("expire-leases", 2)
    leases_in_expiry_order(8)
    attempts = []

    def third_chunk_times_out():
        attempts.append(1)
        if len(attempts) > 2:  # chunks #1 and #2 went
            raise OperationalError("canceling statement due to lock timeout")

    out = StringIO()
    with faults.injected(faults.BEFORE_CHUNK_LOCK, third_chunk_times_out):
        call_command("cleanup_dispatch", "--policy", "expire-leases", "--sync", stdout=out)

    run = Run.objects.get()
    (line,) = out.getvalue().splitlines()
    assert re.fullmatch(
        rf"Dispatched run {run.id} of expire-leases \(items, cutoff [0-9-]+ [0-9:]+ UTC\): "
        r"8 rows eligible; 4 chunks planned \(8 rows\); applied here: 4 of 8 rows "
        rf"deleted in 2 chunks; chunk #3 met \"{LOCK_TIMEOUT}\" past 1 in-task retries: the "
        r"rest of the run is the queue's, which retries it\. State running; took [0-9.]+ s\.",
        line), line
    assert_left_to_the_queue_with_chunk_retrying(run, failed=3)
    finish_from_the_queue(run)
    assert Lease.objects.count() == 0
    assert sum(c.rows_deleted for c in run.chunks.all()) == 8


LOCKED_SETTINGS = f"""
from {os.environ['DJANGO_SETTINGS_MODULE']} import *  # noqa: F403

# Chunks of 20 leases; a lock wait gives up within a fifth of a second, retried once.
LEASES_EXPIRE_CHUNK_SIZE = 20
CLEANUP_CHUNK_BUDGET_MS = 0
CLEANUP_LOCK_TIMEOUT_MS = 200
CLEANUP_TRANSIENT_RETRIES = 1
"""


@pytest.mark.django_db(transaction=True)
def test_sync_json_with_the_table_locked_past_the_retries_is_one_object_and_exit_0(tmp_path):
    (tmp_path / "locked_settings.py").write_text(LOCKED_SETTINGS)
    leases = leases_in_expiry_order(100)
    renewed = LeaseFactory(account=leases[0].account)  # not expired: never deleted
    holder = table_locked_elsewhere()
    try:
        process = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), "cleanup_dispatch", "--policy",
             "expire-leases", "--sync", "--json"],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
            env=subprocess_env(DJANGO_SETTINGS_MODULE="locked_settings",
                               PYTHONPATH=str(tmp_path)))
    finally:
        holder.close()

    assert process.returncode == 0, process.stdout + process.stderr
    assert "Traceback" not in process.stderr
    (line,) = process.stdout.splitlines()
    result = json.loads(line)
    run = Run.objects.get()
    assert (result["run_id"], result["state"], result["eligible"]) == (
        str(run.id), "running", 100)
    assert result["sync"] == {
        "chunks_applied": 0, "rows_changed": 0, "run_rows_changed": 0, "rows_locked": 0,
        "handed_to_queue": True,
        "failed_chunk": 1,
        "cause": LOCK_TIMEOUT,
        "note": f'chunk #1 met "{LOCK_TIMEOUT}" past 1 in-task retries: the rest of the run '
                "is the queue's, which retries it",
    }
    assert result["summary"].endswith(
        "applied here: 0 of 100 rows deleted in 0 chunks; " + result["sync"]["note"] + ".")
    assert_left_to_the_queue_with_chunk_retrying(run, failed=1)

    finish_from_the_queue(run)
    assert sum(c.rows_deleted for c in run.chunks.all()) == 100
    assert list(Lease.objects.all()) == [renewed]


@pytest.mark.django_db
def test_an_interrupted_sync_dispatch_gives_its_messages_back_at_once(backlog, settings,
                                                                     monkeypatch):
    settings.CLEANUP_SYNC_CLAIM_SECONDS = 120
    real_commit = transitions.to_committed
    committed = []

    def interrupted_on_the_third_chunk(chunk, *args, **kwargs):
        if len(committed) == 2:
            raise KeyboardInterrupt("Ctrl-C")
        committed.append(chunk.chunk_id)
        return real_commit(chunk, *args, **kwargs)

    monkeypatch.setattr(transitions, "to_committed", interrupted_on_the_third_chunk)
    with pytest.raises(KeyboardInterrupt):
        dispatch_in_process("expire-leases")

    run = Run.objects.get()
    assert run.state == Run.State.RUNNING
    assert [c.state for c in unfinished(run)] == [Chunk.State.ENQUEUED] * 2
    assert queued_messages() == [c.message for c in unfinished(run)]
    assert_deliverable_now()  # not 120 s from now
    assert Lease.objects.count() == 4


@pytest.mark.django_db
def test_a_sync_of_a_running_runs_key_applies_the_rest_here_and_the_queue_finds_it_done(
        backlog):
    run = dispatch("expire-leases", key="k").run
    first = unfinished(run)[0]
    assert apply_chunk(first.message) == Outcome.DELETED  # a worker took chunk #1
    OrmQ.objects.filter(pk=OrmQ.objects.order_by("id")[0].pk).delete()  # and acknowledged it
    waiting = queued_messages()
    assert [m["chunk_id"] for m in waiting] == [2, 3]

    result = dispatch_in_process("expire-leases", key="k")

    assert (result.created, result.run.pk, result.run.state) == (
        False, run.pk, Run.State.COMPLETED)
    applied = result.applied
    assert (applied.chunks, applied.rows, applied.run_rows) == (5, 5, 6)
    assert ("applied here: 5 rows deleted in 5 chunks (the run's chunks: 6 of 6 rows deleted "
            "in all)") in result.fields()["summary"]
    # What this process planned and applied left nothing in the queue; the messages the
    # workers had are still there, and delivering them changes nothing.
    assert queued_messages() == waiting
    assert [apply_chunk(message) for message in waiting] == [Outcome.NOOP] * 2
    chunks = list(Run.objects.get(pk=run.pk).chunks.all())
    assert sum(c.rows_deleted for c in chunks) == 6 and Lease.objects.count() == 0
    assert sum(c.noop_deliveries for c in chunks) == 2


# transaction=True: the worker is a second real session, on a thread of its own.
@pytest.mark.django_db(transaction=True)
def test_a_chunk_a_worker_finished_first_is_not_counted_as_applied_here(backlog):
    started, worker_took = [], []

    def a_worker_delivers(message) -> None:
        # Another process's worker: its deliveries name it, not this process.
        own = leases._owner
        leases._owner = (os.getpid(), "another-host:4242:worker00")
        try:
            worker_took.append(apply_chunk(message))
        finally:
            leases._owner = own
            connection.close()

    def a_worker_finishes_chunk_2_first():
        chunk = Chunk.objects.filter(chunk_id=2).first()
        # While this process applies chunk #2 (its delivery started), once: the worker's
        # own delivery passes here too.
        if chunk is None or chunk.deliveries != 1 or started:
            return
        started.append(chunk)
        # Its claim lapsed while this process was slow to reach it: a worker has it.
        worker = threading.Thread(target=a_worker_delivers, args=(chunk.message,))
        worker.start()
        worker.join()

    with faults.injected(faults.BEFORE_CHUNK_LOCK, a_worker_finishes_chunk_2_first):
        result = dispatch_in_process("expire-leases")

    assert worker_took == [Outcome.DELETED]
    assert result.run.state == Run.State.COMPLETED and Lease.objects.count() == 0
    applied = result.applied
    # Chunk #2's row is the worker's: applied here are the five others.
    assert (applied.chunks, applied.rows, applied.run_rows) == (5, 5, 6)


@pytest.mark.django_db(transaction=True)  # with Redis the messages go out on commit
def test_with_redis_a_sync_runs_messages_are_sent_and_a_later_delivery_is_a_noop(
        backlog, monkeypatch):
    import redis

    client = redis.from_url(SCRATCH_REDIS_URL)
    client.flushdb()
    monkeypatch.setattr(Conf, "ORM", None)
    monkeypatch.setattr(Conf, "REDIS", SCRATCH_REDIS_URL)
    queue = f"django_q:{Conf.CLUSTER_NAME}:q"
    try:
        result = dispatch_in_process("expire-leases")

        run = Run.objects.get(pk=result.run.pk)
        assert run.state == Run.State.COMPLETED and result.applied.chunks == 6
        # Redis cannot hold a message back: each went to the queue, none to the table.
        assert client.llen(queue) == run.messages_sent == 6 and OrmQ.objects.count() == 0
        payloads = client.lrange(queue, 0, -1)
        delivered = [apply_chunk(SignedPackage.loads(payload)["args"][0])
                     for payload in payloads]
    finally:
        client.flushdb()

    assert delivered == [Outcome.NOOP] * 6
    chunks = list(run.chunks.all())
    assert sum(c.rows_deleted for c in chunks) == 6 and Lease.objects.count() == 0
    assert all(c.noop_deliveries == 1 for c in chunks)


@pytest.mark.django_db
def test_the_rows_eligible_at_dispatch_are_recorded_once(expired_leases):
    run = dispatch("expire-leases").run
    run.refresh_from_db()
    assert run.eligible_at_dispatch == 5

    assert not transitions.record_eligible(run.pk, 99)
    run.refresh_from_db()
    assert run.eligible_at_dispatch == 5


# transaction=True: the server ends the chunk's own session, not a test's transaction.
@pytest.mark.django_db(transaction=True)
def test_a_worker_that_froze_mid_chunk_loses_its_session_and_the_chunk_is_retried(
        settings, expired_leases):
    """The server ends a chunk's transaction left idle past its bound (a frozen worker),
    releasing its rows; the worker, waking up, retries on a new connection: the chunk
    commits once and is never dead-lettered for it."""
    settings.CLEANUP_IDLE_IN_TRANSACTION_TIMEOUT_MS = 300
    run = dispatch("expire-leases").run
    chunk = run.chunks.get(chunk_id=1)
    froze = []

    def freeze_once():
        if not froze:
            froze.append(True)
            time.sleep(1)  # idle in the transaction, past its 300 ms

    with faults.injected(faults.BEFORE_COMMIT, freeze_once):
        apply_chunk(chunk.message)

    chunk.refresh_from_db()
    assert (chunk.state, chunk.rows_deleted, chunk.transient_retries) == (
        Chunk.State.COMMITTED, 5, 1)
    assert Lease.objects.count() == 0


# A real --sync process killed or frozen mid-run, then a real cluster: transaction=True,
# so the subprocesses see what the test committed and the test sees theirs.
CLAIM_SECONDS = 3
PROCESS_SETTINGS = f"""
import os
import signal
import time

from {os.environ['DJANGO_SETTINGS_MODULE']} import *  # noqa: F403

from cleanup import faults

# Small chunks of a fixed size, two in flight: a backlog of 2,000 leases is 100 chunks.
LEASES_EXPIRE_CHUNK_SIZE = 20
CLEANUP_CHUNK_BUDGET_MS = 0
CLEANUP_WINDOW = 2
# The workers get a --sync process's messages this long after each was sent.
CLEANUP_SYNC_CLAIM_SECONDS = {CLAIM_SECONDS}
# A frozen chunk's transaction is ended by the server within a second.
CLEANUP_IDLE_IN_TRANSACTION_TIMEOUT_MS = 1000
if os.environ.get("SLOW_CHUNK_SECONDS"):
    # Each chunk waits before it commits, so the test can kill the process mid-run.
    # Kept referenced: a context manager left to the garbage collector would close,
    # and take its fault out again.
    _slow = faults.injected(faults.BEFORE_COMMIT,
                            lambda: time.sleep(float(os.environ["SLOW_CHUNK_SECONDS"])))
    _slow.__enter__()

_applied = []


def _freeze_at_chunk():
    # SIGSTOP inside the chunk's transaction, after its DELETE.
    _applied.append(1)
    if len(_applied) == int(os.environ["FREEZE_AT_CHUNK"]):
        os.kill(os.getpid(), signal.SIGSTOP)


if os.environ.get("FREEZE_AT_CHUNK"):
    _freeze = faults.injected(faults.BEFORE_COMMIT, _freeze_at_chunk)
    _freeze.__enter__()
"""
QCLUSTER_ENV = {"Q_TIMEOUT": "4", "Q_RETRY": "6", "Q_POLL": "0.1", "Q_WORKERS": "2"}


@pytest.fixture
def process_settings(tmp_path):
    """Environment for a subprocess whose expire-leases chunks hold 20 rows."""
    (tmp_path / "sync_process_settings.py").write_text(PROCESS_SETTINGS)
    return {"DJANGO_SETTINGS_MODULE": "sync_process_settings", "PYTHONPATH": str(tmp_path)}


def leases_backlog(expired: int) -> list[Lease]:
    """``expired`` leases past their expiry, and the leases no run may touch (returned):
    renewed ones and kept ones."""
    account = AccountFactory()
    now = timezone.now()
    Lease.objects.bulk_create(
        Lease(account=account, holder=f"holder-{i}", expires_at=now - timedelta(hours=1, seconds=i))
        for i in range(expired))
    renewed = LeaseFactory.create_batch(20, account=account)  # expire in the future
    kept = LeaseFactory.create_batch(20, account=account, state=Lease.State.KEPT, expired=True)
    return renewed + kept


@contextmanager
def cluster_running(env: dict, log: Path):
    with log.open("w") as output:  # a file, not a pipe nobody reads: its lines never block
        cluster = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "qcluster"],
                                   cwd=ROOT, stdout=output, stderr=subprocess.STDOUT,
                                   env=subprocess_env(**QCLUSTER_ENV, **env))
        try:
            yield cluster
        finally:
            cluster.send_signal(signal.SIGTERM)
            try:
                cluster.wait(30)
            except subprocess.TimeoutExpired:
                cluster.kill()
                cluster.wait()


def the_ledger_equals_reality(run: Run, spared: list[Lease]) -> None:
    run.refresh_from_db()
    chunks = list(run.chunks.all())
    assert run.state == Run.State.COMPLETED
    assert {c.state for c in chunks} <= set(Chunk.DONE)
    # Every row counted deleted is gone, once: no chunk applied or counted twice.
    assert sum(c.rows_deleted for c in chunks) == run.eligible_at_dispatch
    assert set(Lease.objects.values_list("pk", flat=True)) == {lease.pk for lease in spared}


def first_commit_after(run: Run, moment):
    return (run.chunks.filter(committed_at__gt=moment).order_by("committed_at")
            .values_list("committed_at", flat=True).first())


def stopped(process: subprocess.Popen) -> bool:
    """Whether the process is stopped by a signal (state T in /proc)."""
    stat = Path(f"/proc/{process.pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.qcluster
@pytest.mark.django_db(transaction=True)
def test_a_killed_sync_dispatch_is_finished_by_the_cluster_once_its_claim_lapses(
        process_settings, tmp_path):
    spared = leases_backlog(2000)
    process = manage("cleanup_dispatch", "--policy", "expire-leases", "--sync",
                     SLOW_CHUNK_SECONDS="0.2", **process_settings)
    try:
        wait_for(lambda: Chunk.objects.filter(state__in=Chunk.DONE).count() >= 5, timeout=60,
                 interval=0.02, what="a few chunks committed by the --sync process")
    finally:
        process.send_signal(signal.SIGKILL)
        killed = timezone.now()
        process.wait(10)
    run = Run.objects.get()
    assert run.state == Run.State.RUNNING
    assert 5 <= run.chunks.filter(state__in=Chunk.DONE).count() < 100
    # Every message of the run is in the queue, each taken by the dead process: no
    # worker gets one before its claim lapses. The kill may fall between a chunk's
    # commit and its message's acknowledgement, so at most one message more than the
    # unfinished chunks stays behind; redelivered, it finds its chunk done.
    held = list(OrmQ.objects.values_list("lock", flat=True))
    assert 1 <= len(unfinished(run)) <= len(held) <= len(unfinished(run)) + 1
    assert min(held) > killed
    lapses = min(held)
    # Taken as the process planned them, the last a window of chunks before it died.
    assert lapses - killed >= timedelta(seconds=CLAIM_SECONDS - 1)

    with cluster_running(process_settings, tmp_path / "qcluster.log"):
        wait_for(lambda: Run.objects.filter(pk=run.pk, state=Run.State.COMPLETED).exists(),
                 timeout=180, interval=0.5, what="the cluster to finish the run")

    first = first_commit_after(run, killed)
    assert first >= lapses  # not one message taken before its claim lapsed
    took_over = (first - killed).total_seconds()
    assert took_over <= CLAIM_SECONDS + 20
    run.refresh_from_db()
    assert (run.chunks_planned, run.eligible_at_dispatch) == (100, 2000)
    the_ledger_equals_reality(run, spared)
    assert OrmQ.objects.count() == 0
    print(f"\nkilled --sync run: first chunk committed by the cluster {took_over:.2f} s "
          f"after the kill (claim {CLAIM_SECONDS} s, its earliest message taken "
          f"{CLAIM_SECONDS - (lapses - killed).total_seconds():.2f} s before the kill), run "
          f"finished {(run.finished_at - killed).total_seconds():.1f} s after it")


@pytest.mark.qcluster
@pytest.mark.django_db(transaction=True)
def test_a_frozen_sync_process_wakes_to_a_run_the_cluster_finished_and_counts_its_own_rows(
        process_settings, tmp_path):
    spared = leases_backlog(400)
    process = manage("cleanup_dispatch", "--policy", "expire-leases", "--sync",
                     FREEZE_AT_CHUNK="3", **process_settings)
    try:
        wait_for(lambda: process.poll() is not None or stopped(process), timeout=60,
                 what="the --sync process to freeze in chunk #3")
        assert process.poll() is None, process.communicate()[0]
        frozen = timezone.now()
        run = Run.objects.get()
        with cluster_running(process_settings, tmp_path / "qcluster.log"):
            wait_for(lambda: Run.objects.filter(pk=run.pk, state=Run.State.COMPLETED).exists(),
                     timeout=180, interval=0.5, what="the cluster to finish the run")
        took_over = (first_commit_after(run, frozen) - frozen).total_seconds()
        print(f"\nfrozen --sync run: first chunk committed by the cluster {took_over:.2f} s "
              f"after the freeze (claim {CLAIM_SECONDS} s)")
        assert took_over >= CLAIM_SECONDS - 1  # its messages were taken just before
        the_ledger_equals_reality(run, spared)
        counted = list(run.chunks.order_by("chunk_id").values_list("rows_deleted", flat=True))
    finally:
        process.send_signal(signal.SIGCONT)
    output, _ = process.communicate(timeout=60)

    assert process.returncode == 0, output
    assert "Traceback" not in output
    # Waking up changed nothing: no chunk applied or counted twice.
    the_ledger_equals_reality(run, spared)
    assert list(run.chunks.order_by("chunk_id").values_list("rows_deleted", flat=True)) == (
        counted)
    # It applied chunks #1 and #2 (40 rows) before freezing in #3, which the server
    # rolled back when it ended the idle session and the cluster applied.
    summary = output.strip().splitlines()[-1]
    assert ("applied here: 40 rows deleted in 2 chunks (the run's chunks: 400 of 400 rows "
            "deleted in all)") in summary, summary
