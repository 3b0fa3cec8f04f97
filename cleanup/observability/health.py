"""Worker heartbeats and the health report behind GET /health.

Every instant here is the database's: the heartbeat task stamps the database's now(),
and ages are taken by the database against its own now(), so no host's clock (the
worker's, or the web server's) can make a stopped cluster look alive. A beat stamped
in the future (by an older worker, or by hand) proves nothing and counts as stale.
"""

from __future__ import annotations

import math
import os
import socket
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models import DurationField, ExpressionWrapper, F
from django.db.models.functions import Now
from django_q.conf import Conf

from cleanup.conf import conf
from cleanup.models import Run, WorkerHeartbeat
from cleanup.observability.overview import last_successes
from cleanup.policies import all_policies

# now() is the start of the reading transaction, which may begin a moment before a
# beat commits: a beat this far ahead is still a beat.
FUTURE_TOLERANCE = timedelta(seconds=5)


@dataclass(frozen=True)
class Heartbeat:
    host: str
    cluster: str
    pid: int
    beat_at: datetime
    age: timedelta  # the database's now() minus the beat; negative when from the future

    @property
    def from_the_future(self) -> bool:
        return self.age < -FUTURE_TOLERANCE

    def taking_work(self, stale_after: timedelta) -> bool:
        return not self.from_the_future and self.age <= stale_after


def beat() -> WorkerHeartbeat:
    """Record, at the database's now(), that a worker of this cluster just ran a task."""
    host, cluster, pid = conf.NODE_NAME or socket.gethostname(), Conf.CLUSTER_NAME, os.getpid()
    beats = WorkerHeartbeat.objects.filter(host=host, cluster=cluster)
    if not beats.update(pid=pid, beat_at=Now()):
        try:
            with transaction.atomic():
                WorkerHeartbeat.objects.create(host=host, cluster=cluster, pid=pid,
                                               beat_at=Now())
        except IntegrityError:  # another worker of the cluster beat first
            beats.update(pid=pid, beat_at=Now())
    return beats.get()


# A worker beats as it takes a task at most this often: the scheduled heartbeat is one
# task a minute that any cluster's worker may take, so with several clusters on the
# queue each would otherwise beat only when it happens to take that one.
BEAT_EVERY_SECONDS = 15
_last_beat = -math.inf


def beat_now_and_then() -> None:
    """Beat, unless this process did less than ``BEAT_EVERY_SECONDS`` ago."""
    global _last_beat
    if time.monotonic() - _last_beat < BEAT_EVERY_SECONDS:
        return
    beat()
    _last_beat = time.monotonic()


def heartbeats() -> list[Heartbeat]:
    """Every cluster's last beat with its age, both by the database's clock."""
    rows = WorkerHeartbeat.objects.annotate(
        age=ExpressionWrapper(Now() - F("beat_at"), output_field=DurationField())
    ).order_by("host", "cluster")
    return [Heartbeat(row.host, row.cluster, row.pid, row.beat_at, row.age) for row in rows]


def report() -> tuple[bool, dict]:
    """Return (healthy, details): the database answers and some cluster takes work."""
    stale_after = timedelta(seconds=conf.HEARTBEAT_STALE_SECONDS)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        beats = heartbeats()
        successes = last_successes()
        policies = {p.name: _finished_at(successes.get(p.name)) for p in all_policies()}
    except DatabaseError as exc:
        return False, {"database": False, "error": str(exc).strip()}
    clusters = [
        {
            "host": b.host,
            "cluster": b.cluster,
            "pid": b.pid,
            "last_beat": b.beat_at.isoformat(),
            "age_seconds": round(b.age.total_seconds(), 1),
            "taking_work": b.taking_work(stale_after),
            **({"problem": "heartbeat stamped ahead of the database's clock"}
               if b.from_the_future else {}),
        }
        for b in beats
    ]
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
