"""Worker heartbeats and the health report behind GET /health.

Every instant here is the database's: the heartbeat task stamps the database's now(),
and ages are taken by the database against its own now(), so no host's clock (the
worker's, or the web server's) can make a stopped cluster look alive. A beat stamped
in the future (by an older worker, or by hand) proves nothing and counts as stale.

A cluster stopped cleanly (SIGTERM, as a deploy or ``make demo`` stops it) says so at
once rather than after ``CLEANUP_HEARTBEAT_STALE_SECONDS``: its monitor, the django-q2
process that saves the workers' results and exits after the last of them, stamps
``stopped_at`` on its way out; a worker spawning or beating clears it. A cluster killed
outright says nothing and goes stale.
"""

from __future__ import annotations

import math
import multiprocessing
import multiprocessing.util
import os
import socket
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

import structlog
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

log = structlog.get_logger("cleanup.health")
NOT_BEATING = "no cluster has run the heartbeat task recently"


@dataclass(frozen=True)
class Heartbeat:
    host: str
    cluster: str
    pid: int
    beat_at: datetime
    age: timedelta  # the database's now() minus the beat; negative when from the future
    stopped_at: datetime | None = None  # when it said it stopped, since its last beat

    @property
    def from_the_future(self) -> bool:
        return self.age < -FUTURE_TOLERANCE

    def taking_work(self, stale_after: timedelta) -> bool:
        return (self.stopped_at is None and not self.from_the_future
                and self.age <= stale_after)


def _this_cluster() -> dict:
    return {"host": conf.NODE_NAME or socket.gethostname(), "cluster": Conf.CLUSTER_NAME}


def beat() -> WorkerHeartbeat:
    """Record, at the database's now(), that a worker of this cluster just ran a task
    (or is ready to take one): the cluster takes work, whatever it said before."""
    cluster, pid = _this_cluster(), os.getpid()
    beats = WorkerHeartbeat.objects.filter(**cluster)
    if not beats.update(pid=pid, beat_at=Now(), stopped_at=None):
        try:
            with transaction.atomic():
                WorkerHeartbeat.objects.create(**cluster, pid=pid, beat_at=Now())
        except IntegrityError:  # another worker of the cluster beat first
            beats.update(pid=pid, beat_at=Now(), stopped_at=None)
    return beats.get()


def record_stop() -> None:
    """Stamp this cluster stopped, at the database's now(). Called as its monitor exits;
    an error is logged, never raised (the cluster then goes stale instead)."""
    try:
        WorkerHeartbeat.objects.filter(**_this_cluster()).update(stopped_at=Now())
    except DatabaseError as exc:
        log.warning("cluster stop not recorded", error=str(exc))


_stop_awaited = False


def record_stop_at_exit() -> None:
    """In a cluster's monitor (where django-q2 sends post_execute), have ``record_stop``
    run when the process exits: the monitor exits last when the cluster stops. Once per
    process, and only in a process django-q2 started (multiprocessing runs a child's
    exit finalizers as it ends; a web or command process's own exit says nothing of a
    cluster)."""
    global _stop_awaited
    if _stop_awaited or multiprocessing.parent_process() is None:
        return
    multiprocessing.util.Finalize(None, record_stop, exitpriority=10)
    _stop_awaited = True


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
    return [Heartbeat(row.host, row.cluster, row.pid, row.beat_at, row.age, row.stopped_at)
            for row in rows]


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
            "stopped_at": b.stopped_at.isoformat() if b.stopped_at else None,
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
        details["problem"] = no_cluster_problem(beats)
    return taking_work, details


def no_cluster_problem(beats: list[Heartbeat]) -> str:
    """Why no cluster takes work, in words: every one stopped, or none beats."""
    if beats and all(b.stopped_at for b in beats):
        last = max(beats, key=lambda b: b.stopped_at)
        stopped = "the cluster" if len(beats) == 1 else "every cluster"
        return (f"{stopped} stopped (the last, {last.cluster}@{last.host}, at "
                f"{last.stopped_at:%Y-%m-%d %H:%M:%S %Z})")
    return NOT_BEATING


def _finished_at(run: Run | None) -> str | None:
    return run.finished_at.isoformat() if run and run.finished_at else None
