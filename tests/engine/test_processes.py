"""Real processes: a qcluster doing the work, and workers that die mid-chunk.

transaction=True throughout: the subprocesses connect to the test database on their
own and must see what the test committed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from django_q.models import OrmQ

from cleanup.engine.dispatch import dispatch
from cleanup.engine.worker import Outcome, apply_chunk
from cleanup.models import Chunk, Run
from tests.conftest import ROOT, manage, subprocess_env, wait_for
from tests.engine_app.factories import AccountFactory, LeaseFactory, LeaseLogFactory
from tests.engine_app.models import Lease

pytestmark = pytest.mark.django_db(transaction=True)

# Short leases so a redelivery takes seconds: timeout 4 s, retry 6 s.
QCLUSTER_ENV = {"Q_TIMEOUT": "4", "Q_RETRY": "6", "Q_POLL": "0.1", "Q_WORKERS": "2"}


@pytest.fixture
def qcluster():
    processes = []

    def start():
        process = manage("qcluster", **QCLUSTER_ENV)
        processes.append(process)
        return process

    yield start
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.mark.qcluster
def test_qcluster_applies_runs_and_redelivery_after_commit_is_noop(qcluster, chunk_size):
    account = AccountFactory()
    LeaseFactory.create_batch(6, account=account, expired=True)
    survivor = LeaseFactory(account=account)
    LeaseLogFactory.create_batch(3, stale=True)  # one account each: three range chunks
    chunk_size("expire-leases", 2)
    leases_run = dispatch("expire-leases").run
    logs_run = dispatch("purge-lease-logs").run
    first = leases_run.chunks.get(chunk_id=1)
    # A worker that committed chunk 1 and died before django-q2 acknowledged it: the
    # message is still in the queue.
    apply_chunk(first.message)
    assert OrmQ.objects.count() == 3 + 3

    qcluster()
    wait_for(
        lambda: not Chunk.objects.exclude(state=Chunk.State.ACKNOWLEDGED).exists(),
        timeout=60,
        what="every chunk acknowledged",
    )

    assert list(Lease.objects.all()) == [survivor]
    for run in (leases_run, logs_run):
        run.refresh_from_db()
        assert run.state == Run.State.COMPLETED
    first.refresh_from_db()
    assert (first.deliveries, first.noop_deliveries, first.rows_deleted) == (2, 1, 2)
    assert sum(c.rows_deleted for c in leases_run.chunks.all()) == 6
    wait_for(lambda: OrmQ.objects.count() == 0, what="the queue to drain")


KILL_MID_CHUNK = """
import json, os, signal, sys
import django
django.setup()
from cleanup.engine import transitions, worker

def die_before_commit(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

transitions.to_committed = die_before_commit
worker.apply_chunk(json.loads(sys.argv[1]))
"""


def test_poison_chunk_killing_its_worker_is_dead_lettered_after_the_limit(settings):
    settings.CLEANUP_MAX_UNFINISHED_DELIVERIES = 3
    LeaseFactory.create_batch(2, expired=True)
    chunk = dispatch("expire-leases").run.chunks.get()

    for _ in range(3):
        process = subprocess.run(
            [sys.executable, "-c", KILL_MID_CHUNK, json.dumps(chunk.message)],
            # The tests' settings (subprocess_env's), so the engine app's policies exist
            # in the subprocess.
            cwd=ROOT, env=subprocess_env(),
            capture_output=True, text=True, timeout=60,
        )
        assert process.returncode == -signal.SIGKILL, process.stdout + process.stderr

    chunk.refresh_from_db()
    assert (chunk.deliveries, chunk.deliveries_completed, chunk.state) == (3, 0, "enqueued")
    assert Lease.objects.count() == 2  # each killed DELETE rolled back

    assert apply_chunk(chunk.message) == Outcome.DEAD_LETTERED

    chunk.refresh_from_db()
    assert chunk.state == Chunk.State.DEAD_LETTERED
    assert chunk.run.state == Run.State.COMPLETED_WITH_DEAD_LETTERS
    assert Lease.objects.count() == 2


def test_heartbeat_tells_a_frozen_cluster_from_an_idle_one(client, settings):
    from django_q.tasks import async_task

    from cleanup.models import WorkerHeartbeat

    settings.CLEANUP_HEARTBEAT_STALE_SECONDS = 2
    process = manage("qcluster", **{**QCLUSTER_ENV, "Q_WORKERS": "1"})
    try:
        async_task("cleanup.tasks.heartbeat")
        beat = wait_for(lambda: WorkerHeartbeat.objects.first(), timeout=30,
                        what="the first heartbeat")
        wait_for(lambda: client.get("/health").status_code == 200, what="healthy")

        os.kill(beat.pid, signal.SIGSTOP)  # the only worker stops taking work
        try:
            async_task("cleanup.tasks.heartbeat")
            wait_for(lambda: client.get("/health").status_code == 503, timeout=15,
                     what="health to turn")
            assert client.get("/health").json()["clusters"][0]["taking_work"] is False
        finally:
            os.kill(beat.pid, signal.SIGCONT)

        wait_for(lambda: client.get("/health").status_code == 200, timeout=30,
                 what="health to recover")
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
