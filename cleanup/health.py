"""Worker heartbeats and the health report behind GET /health."""

from __future__ import annotations

import os
import socket
from datetime import timedelta

from django.db import DatabaseError, connection
from django.utils import timezone
from django_q.conf import Conf

from cleanup.conf import conf
from cleanup.models import Run, WorkerHeartbeat
from cleanup.policies import all_policies


def beat() -> WorkerHeartbeat:
    """Record that a worker of this cluster, on this host, just ran a task."""
    heartbeat, _ = WorkerHeartbeat.objects.update_or_create(
        host=socket.gethostname(),
        cluster=Conf.CLUSTER_NAME,
        defaults={"pid": os.getpid(), "beat_at": timezone.now()},
    )
    return heartbeat


def report() -> tuple[bool, dict]:
    """Return (healthy, details): the database answers and some cluster takes work."""
    now = timezone.now()
    stale_after = timedelta(seconds=conf.HEARTBEAT_STALE_SECONDS)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        clusters = [
            {
                "host": h.host,
                "cluster": h.cluster,
                "pid": h.pid,
                "last_beat": h.beat_at.isoformat(),
                "age_seconds": round((now - h.beat_at).total_seconds(), 1),
                "taking_work": now - h.beat_at <= stale_after,
            }
            for h in WorkerHeartbeat.objects.order_by("host", "cluster")
        ]
        policies = {
            p.name: _finished_at(
                Run.objects.filter(policy=p.name, state=Run.State.COMPLETED)
                .order_by("-finished_at").first()
            )
            for p in all_policies()
        }
    except DatabaseError as exc:
        return False, {"database": False, "error": str(exc).strip()}
    taking_work = any(c["taking_work"] for c in clusters)
    details = {
        "database": True,
        "clusters": clusters,
        "last_completed_run": policies,
        "heartbeat_stale_after_seconds": conf.HEARTBEAT_STALE_SECONDS,
    }
    if not taking_work:
        details["problem"] = "no cluster has run the heartbeat task recently"
    return taking_work, details


def _finished_at(run: Run | None) -> str | None:
    return run.finished_at.isoformat() if run and run.finished_at else None
