"""/health and the heartbeat gauge go by the database's clock: no host's clock can make
a stopped cluster look alive, nor a live one stale."""

from __future__ import annotations

import math
import socket
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import F
from django.db.models.functions import Now
from django.utils import timezone
from django_q.conf import Conf

from cleanup.models import WorkerHeartbeat
from cleanup.observability import health
from cleanup.observability.health import beat
from tests.observability.test_metrics import scrape, value

pytestmark = pytest.mark.django_db
THIS_CLUSTER = {"host": socket.gethostname(), "cluster": Conf.CLUSTER_NAME}


def database_clock():
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        return cursor.fetchone()[0]


@pytest.fixture
def wrong_host_clock(monkeypatch):
    """This host's clock a year ahead of the database's."""
    ahead = timezone.now() + timedelta(days=365)
    monkeypatch.setattr(timezone, "now", lambda: ahead)


def test_a_heartbeat_from_the_future_is_not_a_cluster_taking_work(client):
    beat()
    WorkerHeartbeat.objects.update(beat_at=F("beat_at") + timedelta(days=365))

    response = client.get("/health")

    assert response.status_code == 503
    body = response.json()
    assert body["healthy"] is False
    assert body["problem"] == "no cluster has run the heartbeat task recently"
    [cluster] = body["clusters"]
    assert cluster["taking_work"] is False
    assert cluster["problem"] == "heartbeat stamped ahead of the database's clock"
    assert cluster["age_seconds"] == pytest.approx(-365 * 86400, abs=2)
    # Never a negative age, which would keep the no-worker alert quiet: no age at all.
    assert value(scrape(client), "cleanup_heartbeat_age_seconds", **THIS_CLUSTER) == math.inf


def test_a_beat_a_moment_ahead_is_still_a_beat(client):
    beat()
    WorkerHeartbeat.objects.update(beat_at=Now() + timedelta(seconds=2))

    assert client.get("/health").status_code == 200
    assert value(scrape(client), "cleanup_heartbeat_age_seconds", **THIS_CLUSTER) == 0


def test_heartbeats_are_stamped_with_the_databases_clock(wrong_host_clock):
    before = database_clock()
    stamped = beat().beat_at
    assert before <= stamped <= database_clock()


def test_ages_come_from_the_database_not_the_web_hosts_clock(client, wrong_host_clock):
    beat()
    WorkerHeartbeat.objects.update(beat_at=Now() - timedelta(seconds=30))

    response = client.get("/health")

    assert response.status_code == 200
    assert response.json()["clusters"][0]["age_seconds"] == pytest.approx(30, abs=2)
    [heartbeat] = health.heartbeats()
    assert heartbeat.age.total_seconds() == pytest.approx(30, abs=2)


def test_a_heartbeat_stale_by_the_databases_clock_is_503(client):
    beat()
    WorkerHeartbeat.objects.update(beat_at=Now() - timedelta(minutes=10))

    assert client.get("/health").status_code == 503
    age = value(scrape(client), "cleanup_heartbeat_age_seconds", **THIS_CLUSTER)
    assert age == pytest.approx(600, abs=2)


def test_two_clusters_on_one_machine_beat_under_their_own_node_names(settings):
    for node in ("host-a", "host-b"):
        settings.CLEANUP_NODE_NAME = node
        beat()
    assert sorted(WorkerHeartbeat.objects.values_list("host", flat=True)) == [
        "host-a", "host-b"]


def test_a_worker_beats_as_it_takes_tasks_at_most_every_fifteen_seconds(monkeypatch):
    from django.test.utils import CaptureQueriesContext

    monkeypatch.setattr(health, "_last_beat", -math.inf)
    with CaptureQueriesContext(connection) as first:
        health.beat_now_and_then()
    with CaptureQueriesContext(connection) as soon_after:
        health.beat_now_and_then()
    monkeypatch.setattr(health, "_last_beat", health._last_beat - health.BEAT_EVERY_SECONDS)
    with CaptureQueriesContext(connection) as later:
        health.beat_now_and_then()

    assert WorkerHeartbeat.objects.filter(**THIS_CLUSTER).count() == 1
    assert (len(first) > 0, len(soon_after), len(later) > 0) == (True, 0, True)


def test_a_cluster_that_stopped_says_so_at_once_until_a_worker_beats_again(client, admin_user):
    beat()
    health.record_stop()  # what its monitor does as the cluster exits (SIGTERM)

    response = client.get("/health")
    assert response.status_code == 503
    body = response.json()
    [cluster] = body["clusters"]
    assert cluster["taking_work"] is False and cluster["stopped_at"]
    assert body["problem"].startswith(
        f"the cluster stopped (the last, {Conf.CLUSTER_NAME}@{socket.gethostname()}, at ")
    # However fresh its last beat: +Inf, which the no-worker alert pages on.
    assert value(scrape(client), "cleanup_heartbeat_age_seconds", **THIS_CLUSTER) == math.inf
    client.force_login(admin_user)
    page = client.get("/admin/cleanup/cleanupoverview/").content.decode()
    assert "the cluster stopped (the last at" in page and "All clear" not in page

    beat()  # a worker of a cluster started again
    assert client.get("/health").json()["clusters"][0] == {
        **cluster, "taking_work": True, "stopped_at": None,
        "age_seconds": pytest.approx(0, abs=2), "last_beat": WorkerHeartbeat.objects.get(
        ).beat_at.isoformat(), "pid": cluster["pid"]}


def test_a_stop_is_recorded_only_in_a_process_a_cluster_started():
    """A web or command process ending says nothing of a cluster: only a process that
    multiprocessing started (django-q2's monitor) awaits its exit to record a stop."""
    health.record_stop_at_exit()
    assert health._stop_awaited is False
