"""Lost and never-sent messages, the Redis broker's path, and the health report."""

from __future__ import annotations

from datetime import timedelta

import pytest
import redis
from django.utils import timezone
from django_q.conf import Conf
from django_q.models import OrmQ

from cleanup.engine import transport
from cleanup.engine.dispatch import dispatch
from cleanup.engine.reconcile import reconcile
from cleanup.engine.worker import Outcome, apply_chunk
from cleanup.models import Chunk, WorkerHeartbeat
from cleanup.observability.health import beat
from tests.conftest import SCRATCH_REDIS_URL
from tests.engine_app.models import Lease

pytestmark = pytest.mark.django_db
LONG_AGO = timezone.now() - timedelta(hours=1)


def test_silent_enqueued_chunk_is_resent_once_per_lease(expired_leases):
    chunk = dispatch("expire-leases").run.chunks.get()
    OrmQ.objects.all().delete()  # the message was lost (a purged queue)
    Chunk.objects.filter(pk=chunk.pk).update(planned_at=LONG_AGO, enqueued_at=LONG_AGO)

    first, second = reconcile(), reconcile()

    assert (first.resent, second.resent) == (1, 0)
    assert OrmQ.objects.count() == 1
    chunk.refresh_from_db()
    assert chunk.reconciles == 1
    assert apply_chunk(chunk.message) == Outcome.DELETED


def test_nothing_is_resent_while_the_queue_still_holds_messages(expired_leases):
    chunk = dispatch("expire-leases").run.chunks.get()
    Chunk.objects.filter(pk=chunk.pk).update(planned_at=LONG_AGO, enqueued_at=LONG_AGO)
    assert OrmQ.objects.count() == 1  # a backlog, not a loss

    assert reconcile().resent == 0
    assert OrmQ.objects.count() == 1


def test_recent_or_finished_chunks_are_left_alone(expired_leases):
    chunk = dispatch("expire-leases").run.chunks.get()
    assert reconcile().resent == 0  # just sent: its message may still be waiting
    apply_chunk(chunk.message)
    Chunk.objects.filter(pk=chunk.pk).update(planned_at=LONG_AGO, enqueued_at=LONG_AGO)
    assert reconcile().resent == 0


def test_chunks_planned_but_never_sent_are_sent(expired_leases, monkeypatch):
    # Another broker sends after the commit; here the process "died" before that
    # (the test transaction never commits, so the on-commit send never runs).
    monkeypatch.setattr(transport, "queue_shares_transaction", lambda: False)
    chunk = dispatch("expire-leases").run.chunks.get()
    assert (chunk.state, OrmQ.objects.count()) == (Chunk.State.PLANNED, 0)
    Chunk.objects.filter(pk=chunk.pk).update(planned_at=LONG_AGO)

    result = reconcile()

    assert (result.resent, result.never_sent) == (1, 1)
    chunk.refresh_from_db()
    assert chunk.state == Chunk.State.ENQUEUED
    assert OrmQ.objects.count() == 1


@pytest.fixture
def redis_broker(monkeypatch):
    """django-q2's Redis broker on a scratch database (Conf is read at import)."""
    url = SCRATCH_REDIS_URL
    client = redis.from_url(url)
    client.flushdb()
    monkeypatch.setattr(Conf, "ORM", None)
    monkeypatch.setattr(Conf, "REDIS", url)
    yield client
    client.flushdb()


@pytest.mark.django_db(transaction=True)  # the messages go out on commit
def test_with_redis_messages_are_sent_after_the_run_commits(redis_broker, account, chunk_size):
    from tests.engine_app.factories import LeaseFactory

    chunk_size("expire-leases", 2)
    LeaseFactory.create_batch(3, account=account, expired=True)

    run = dispatch("expire-leases").run

    assert redis_broker.llen(f"django_q:{Conf.CLUSTER_NAME}:q") == 2
    assert set(run.chunks.values_list("state", flat=True)) == {Chunk.State.ENQUEUED}
    run.refresh_from_db()
    assert run.messages_sent == 2
    for chunk in run.chunks.all():
        apply_chunk(chunk.message)
    assert Lease.objects.count() == 0


def test_health_is_503_without_a_recent_heartbeat(client, settings):
    response = client.get("/health")
    assert response.status_code == 503
    assert response.json()["problem"] == "no cluster has run the heartbeat task recently"

    beat()
    response = client.get("/health")
    body = response.json()
    assert response.status_code == 200
    assert body["database"] is True and body["clusters"][0]["taking_work"] is True
    assert {"expire-leases", "purge-lease-logs"} <= set(body["last_completed_run"])

    WorkerHeartbeat.objects.update(beat_at=timezone.now() - timedelta(minutes=10))
    assert client.get("/health").status_code == 503
