"""A --sync run whose process died is taken over by the workers once its lease lapses
(CLEANUP_SYNC_LEASE_SECONDS after its last chunk began, on the database's clock): the
next scheduled slot, the reconciler or a chunk's top-up hands it to the queue then,
and a slot never joins a run that nobody applies."""

from __future__ import annotations

import signal
import subprocess
import sys
from datetime import timedelta

import pytest
from django.utils import timezone
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from cleanup.conf import conf
from cleanup.engine import dispatch as dispatch_module
from cleanup.engine import leases, sync_lease
from cleanup.engine.dispatch import dispatch, dispatch_in_process
from cleanup.engine.reconcile import reconcile
from cleanup.engine.worker import apply_chunk
from cleanup.models import Chunk, Run, Slot
from cleanup.models import Lease as WorkLease
from cleanup.scheduling.schedules import dispatch_slot
from tests.conftest import ROOT, SCRATCH_REDIS_URL, manage, subprocess_env, wait_for
from tests.engine_app.factories import AccountFactory, LeaseFactory
from tests.engine_app.models import Lease

LONG_AGO = timezone.now() - timedelta(hours=1)


def queued_messages() -> list[dict]:
    return [SignedPackage.loads(q.payload)["args"][0] for q in OrmQ.objects.order_by("id")]


def unfinished(run: Run) -> list[Chunk]:
    return list(run.chunks.filter(state__in=Chunk.UNFINISHED).order_by("chunk_id"))


@pytest.fixture
def killed_sync(monkeypatch):
    """``killed_sync(n)``: a --sync dispatch whose process dies after applying ``n``
    chunks. Nothing hands its run over; its lease is given up on the way out."""

    def start(applied: int, **options) -> Run:
        def dies(run, progress=None):
            for _ in range(applied):
                apply_chunk(unfinished(run)[0].message)
            raise SystemExit("killed")

        with monkeypatch.context() as patched:
            patched.setattr(dispatch_module, "apply_in_process", dies)
            with pytest.raises(SystemExit):
                dispatch_in_process("expire-leases", **options)
        run = Run.objects.filter(in_process=True).get()
        assert run.state == Run.State.RUNNING and not sync_lease.alive([run.pk])
        return run

    return start


@pytest.fixture
def backlog(db, settings, chunk_size):
    settings.CLEANUP_WINDOW = 2
    chunk_size("expire-leases", 1)
    return LeaseFactory.create_batch(6, account=AccountFactory(), expired=True)


@pytest.mark.django_db
def test_a_slot_takes_over_a_sync_run_whose_process_died_before_joining_it(backlog,
                                                                          killed_sync):
    run = killed_sync(2)
    assert [c.state for c in unfinished(run)] == [Chunk.State.PLANNED] * 2
    assert OrmQ.objects.count() == 0  # a --sync run sends nothing: only its process applies it

    joined = dispatch_slot("expire-leases", timezone.now().replace(second=0, microsecond=0))

    assert joined.pk == run.pk
    assert Slot.objects.get().outcome == Slot.Outcome.COALESCED
    run.refresh_from_db()
    assert run.in_process is False
    assert [c.state for c in unfinished(run)] == [Chunk.State.ENQUEUED] * 2
    assert queued_messages() == [c.message for c in unfinished(run)]


@pytest.mark.django_db
def test_a_live_sync_process_keeps_its_run_until_its_lease_lapses(backlog, killed_sync):
    run = killed_sync(1)
    # Another process holds the run's lease, unexpired.
    assert leases.take(sync_lease.name(run.pk), "another-host:4242:live",
                       conf.SYNC_LEASE_SECONDS)
    Chunk.objects.filter(run=run).update(planned_at=LONG_AGO)  # silent a whole redelivery window
    joined = dispatch_slot("expire-leases", timezone.now().replace(second=0, microsecond=0))
    assert joined.pk == run.pk
    result = reconcile()
    assert (result.taken_over, result.resent) == (0, 0)
    run.refresh_from_db()
    assert run.in_process is True and OrmQ.objects.count() == 0

    # The process froze or died: nothing renews the lease, and its time runs out.
    WorkLease.objects.filter(name=sync_lease.name(run.pk)).update(
        expires_at=timezone.now() - timedelta(seconds=1))
    result = reconcile()

    assert result.taken_over == 1
    run.refresh_from_db()
    assert run.in_process is False
    assert queued_messages() == [c.message for c in unfinished(run)]
    assert not WorkLease.objects.filter(name=sync_lease.name(run.pk)).exists()


@pytest.mark.django_db
def test_a_chunk_committing_takes_over_an_abandoned_sync_run_of_its_policy(db, settings,
                                                                          chunk_size,
                                                                          killed_sync):
    settings.CLEANUP_WINDOW = 3
    chunk_size("expire-leases", 1)
    now = timezone.now()
    account = AccountFactory()
    LeaseFactory.create_batch(2, account=account, expires_at=now - timedelta(hours=2))
    LeaseFactory.create_batch(3, account=account, expires_at=now - timedelta(minutes=10))
    queued = dispatch("expire-leases", key="queued", cutoff=now - timedelta(hours=1)).run
    abandoned = killed_sync(0)
    assert (queued.chunks_planned, abandoned.chunks_planned) == (2, 1)

    apply_chunk(unfinished(queued)[0].message)  # a worker's commit tops the window up

    abandoned.refresh_from_db()
    assert abandoned.in_process is False
    # Its planned chunk sent, and the room the commit freed planned and sent too.
    assert [c.state for c in unfinished(abandoned)] == [Chunk.State.ENQUEUED] * 2
    assert {c.message["chunk_id"] for c in unfinished(abandoned)} <= {
        m["chunk_id"] for m in queued_messages() if m["run_id"] == str(abandoned.pk)}


@pytest.mark.django_db
def test_an_interrupted_sync_dispatch_hands_its_run_to_the_queue_at_once(backlog,
                                                                        monkeypatch):
    from cleanup.engine import transitions

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
    assert run.in_process is False and run.state == Run.State.RUNNING
    assert [c.state for c in unfinished(run)] == [Chunk.State.ENQUEUED] * 2
    assert queued_messages() == [c.message for c in unfinished(run)]
    assert Lease.objects.count() == 4


@pytest.mark.django_db(transaction=True)  # with Redis the messages go out on commit
def test_with_redis_an_abandoned_sync_run_is_sent_once_its_takeover_commits(backlog,
                                                                          killed_sync,
                                                                          monkeypatch):
    import redis
    from django_q.conf import Conf

    client = redis.from_url(SCRATCH_REDIS_URL)
    client.flushdb()
    monkeypatch.setattr(Conf, "ORM", None)
    monkeypatch.setattr(Conf, "REDIS", SCRATCH_REDIS_URL)
    try:
        run = killed_sync(1)

        reconcile()

        run.refresh_from_db()
        assert run.in_process is False
        assert [c.state for c in unfinished(run)] == [Chunk.State.ENQUEUED] * 2
        assert client.llen(f"django_q:{Conf.CLUSTER_NAME}:q") == 2
        run.refresh_from_db()
        assert run.messages_sent == 2
    finally:
        client.flushdb()


# A real process killed mid-run: transaction=True, so the subprocesses see what the test
# committed and the test sees theirs.
SETTINGS = """
import os
import time

from tests.settings import *  # noqa: F403

from cleanup import faults

# Small chunks of a fixed size, so a backlog of 2,000 leases is 100 chunks.
LEASES_EXPIRE_CHUNK_SIZE = 20
CLEANUP_CHUNK_BUDGET_MS = 0
# A killed --sync process's run is the workers' this long after its last chunk began.
CLEANUP_SYNC_LEASE_SECONDS = 3
if os.environ.get("SLOW_CHUNK_SECONDS"):
    # Each chunk waits before it commits, so the test can kill the process mid-run.
    # Kept referenced: a context manager left to the garbage collector would close,
    # and take its fault out again.
    _slow = faults.injected(faults.BEFORE_COMMIT,
                            lambda: time.sleep(float(os.environ["SLOW_CHUNK_SECONDS"])))
    _slow.__enter__()
"""
QCLUSTER_ENV = {"Q_TIMEOUT": "4", "Q_RETRY": "6", "Q_POLL": "0.1", "Q_WORKERS": "2"}


@pytest.fixture
def small_chunk_settings(tmp_path):
    """Environment for a subprocess whose expire-leases chunks hold 20 rows."""
    (tmp_path / "small_chunk_settings.py").write_text(SETTINGS)
    return {"DJANGO_SETTINGS_MODULE": "small_chunk_settings", "PYTHONPATH": str(tmp_path)}


@pytest.mark.qcluster
@pytest.mark.django_db(transaction=True)
def test_a_killed_sync_dispatch_is_handed_to_the_queue_by_the_next_slot_and_finished(
        small_chunk_settings, tmp_path):
    account = AccountFactory()
    now = timezone.now()
    Lease.objects.bulk_create(
        Lease(account=account, holder=f"holder-{i}", expires_at=now - timedelta(hours=1, seconds=i))
        for i in range(2000))
    renewed = LeaseFactory.create_batch(20, account=account)  # expire in the future
    kept = LeaseFactory.create_batch(20, account=account, state=Lease.State.KEPT, expired=True)
    process = manage("cleanup_dispatch", "--policy", "expire-leases", "--sync",
                     SLOW_CHUNK_SECONDS="0.2", **small_chunk_settings)
    try:
        wait_for(lambda: Chunk.objects.filter(state__in=Chunk.DONE).count() >= 5, timeout=60,
                 what="a few chunks committed by the --sync process")
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(10)
    run = Run.objects.get()
    done_when_killed = run.chunks.filter(state__in=Chunk.DONE).count()
    assert run.in_process is True and run.state == Run.State.RUNNING
    assert 5 <= done_when_killed < 100 and OrmQ.objects.count() == 0
    # The database drops the lease with the dead process's session: no clock involved.
    wait_for(lambda: not sync_lease.alive([run.pk]), timeout=10, what="the session to end")

    joined = dispatch_slot("expire-leases", timezone.now().replace(second=0, microsecond=0))

    # At once: the slot took the run over and its unfinished chunks are in the queue.
    assert joined.pk == run.pk and Slot.objects.get().outcome == Slot.Outcome.COALESCED
    run.refresh_from_db()
    assert run.in_process is False
    assert queued_messages() == [c.message for c in unfinished(run)] and unfinished(run)

    log = tmp_path / "qcluster.log"
    with log.open("w") as output:  # a file, not a pipe nobody reads: its lines never block
        cluster = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "qcluster"],
                                   cwd=ROOT, stdout=output, stderr=subprocess.STDOUT,
                                   env=subprocess_env(**QCLUSTER_ENV, **small_chunk_settings))
        try:
            wait_for(lambda: Run.objects.filter(pk=run.pk, state=Run.State.COMPLETED).exists(),
                     timeout=180, interval=0.5, what="the cluster to finish the run")
        finally:
            cluster.send_signal(signal.SIGTERM)
            try:
                cluster.wait(30)
            except subprocess.TimeoutExpired:
                cluster.kill()
                cluster.wait()

    run.refresh_from_db()
    chunks = list(run.chunks.all())
    assert (run.chunks_planned, run.eligible_at_dispatch) == (100, 2000)
    assert {c.state for c in chunks} <= set(Chunk.DONE)
    # The ledger equals reality: every row counted deleted is gone, and nothing else is.
    assert sum(c.rows_deleted for c in chunks) == 2000
    assert set(Lease.objects.values_list("pk", flat=True)) == {
        lease.pk for lease in renewed + kept}
