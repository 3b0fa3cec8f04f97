"""The outbox's publishers in the soak: both clusters run them at once, faults hit them
in the middle of a handler, and the soak's own process drains what is left."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

from django.db import connection, connections, transaction
from django.utils import timezone
from django_q.models import Task
from django_q.tasks import async_task

from cleanup.models import Event
from cleanup.outbox import publish
from cleanup.scheduling.schedules import ENGINE_SCHEDULES
from config.devtools.processes import descendants, title
from config.devtools.soak.traffic import TrafficLog
from reservations.exceptions import ReservationError
from reservations.models import SeatHold, Section, WaitlistEntry
from reservations.services import release_hold
from reservations.waitlist import SEAT_FREED

# The task the engine's cleanup:publish-events schedule runs.
PUBLISH_TASK = ENGINE_SCHEDULES["publish-events"]
PUBLISHER_GROUP = "soak-publisher"
# The schedule fires once a minute: far too seldom for a soak of seconds. The soak
# enqueues two at a time instead, so that both clusters' workers publish at once.
PUBLISH_EVERY = 0.5
SIGKILL_PUBLISHER = "sigkill_worker_mid_publish"
TERMINATE_PUBLISHER = "terminate_publisher_backend"
KINDS = (SIGKILL_PUBLISHER, TERMINATE_PUBLISHER)
# The handler's first statement (reservations.waitlist.offer_freed_seat) waiting on the
# section's row lock: its .first() of a section named by id orders by id, which no
# learner's lock of a section does (they .get() it by id, or .first() it through a
# subquery on their hold or entry), so a backend waiting in it is a publisher's.
HANDLER_WAITING = (
    "SELECT pid, client_port FROM pg_stat_activity WHERE datname = current_database() "
    "AND wait_event_type = 'Lock' AND query LIKE %s AND query NOT LIKE '%%(SELECT%%'"
)
HANDLER_STATEMENT = (f'SELECT %FROM "{Section._meta.db_table}" WHERE %ORDER BY %'
                     "FOR NO KEY UPDATE")


class Publishers(threading.Thread):
    """Enqueue publishers at a short interval until told to stop, and sample how often
    a worker of each cluster was publishing at the same moment."""

    def __init__(self, clusters: list, stop: threading.Event):
        super().__init__(daemon=True)
        self.clusters, self.stop = clusters, stop
        self.lock = threading.Lock()
        self.enqueued = 0
        self.samples: Counter = Counter()

    def enqueue(self, count: int = 2) -> None:
        """Have the clusters run ``count`` publishers, as the schedule would. Saved: the
        clusters keep no task results, and the report reads these."""
        for _ in range(count):
            async_task(PUBLISH_TASK, group=PUBLISHER_GROUP, save=True)
        with self.lock:
            self.enqueued += count

    def run(self) -> None:
        pending = Event.objects.filter(name=SEAT_FREED, state=Event.State.PENDING)
        try:
            while not self.stop.wait(PUBLISH_EVERY):
                # Only when there is work: each run takes a worker from the chunks.
                if pending.filter(available_at__lte=timezone.now()).exists():
                    self.enqueue()
                at_work = [bool(publishing(cluster)) for cluster in self.clusters]
                self.samples["taken"] += 1
                self.samples["in_both_clusters_at_once"] += all(at_work)
        finally:
            connections.close_all()


class SectionLocker(threading.Thread):
    """Hold a section's row lock until released, so the handler of its next freed seat
    waits on it with its event taken: a publisher in flight."""

    def __init__(self, section_id: int):
        super().__init__(daemon=True)
        self.section_id = section_id
        self.locked, self.release = threading.Event(), threading.Event()

    def run(self) -> None:
        try:
            with transaction.atomic():
                list(Section.objects.select_for_update().filter(pk=self.section_id)
                     .values_list("pk"))
                self.locked.set()
                self.release.wait(6)  # under the task timeout plus django-q2's margin
        finally:
            self.locked.set()
            connections.close_all()


class PublisherFaults(threading.Thread):
    """Faults on publishers in the middle of a handler, one after another until told to
    stop: a learner frees a seat in a waitlisted section, the section is locked, a
    publisher is enqueued, and its handler is caught waiting for that lock, its event
    held. A thread of its own beside the soak's injector, so the chunk faults keep
    their pace; only the faults that hit count."""

    def __init__(self, clusters: list, log: TrafficLog, publishers: Publishers,
                 stop: threading.Event, seed: int):
        super().__init__(daemon=True)
        self.clusters, self.log, self.publishers = clusters, log, publishers
        self.stop, self.random = stop, random.Random(seed)
        self.hits: Counter = Counter()
        # SIGKILLs that found the very worker whose handler waited (by its socket).
        self.kills_mid_handler = 0
        self.errors: list[str] = []

    def run(self) -> None:
        faults = {SIGKILL_PUBLISHER: self.sigkill_publisher,
                  TERMINATE_PUBLISHER: self.terminate_publisher}
        try:
            while not self.stop.wait(self.random.uniform(1.0, 2.0)):
                kind = min(faults, key=lambda each: (self.hits[each], self.random.random()))
                try:
                    faults[kind]()
                except Exception as exc:  # noqa: BLE001 - a failed injection is reported
                    self.errors.append(f"{faults[kind].__name__}: {exc!r}")
        finally:
            connections.close_all()

    def sigkill_publisher(self) -> None:
        def kill(backend_pid: int, client_port: int | None) -> None:
            busy = [pid for cluster in self.clusters for pid in publishing(cluster)]
            if busy:
                worker = worker_of(client_port, busy)
                self.kills_mid_handler += worker is not None
                os.kill(worker or self.random.choice(busy), signal.SIGKILL)
                self.hits[SIGKILL_PUBLISHER] += 1

        self._in_handler(kill)

    def terminate_publisher(self) -> None:
        def terminate(backend_pid: int, client_port: int | None) -> None:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [backend_pid])
                if cursor.fetchone()[0]:
                    self.hits[TERMINATE_PUBLISHER] += 1

        self._in_handler(terminate)

    def _in_handler(self, act) -> None:
        """Free a seat where learners wait, lock its section and ``act`` on the backend
        of the handler that then waits for it; nothing if none was caught in time."""
        section_id = self._free_a_seat()
        if section_id is None:
            return
        locker = SectionLocker(section_id)
        locker.start()
        locker.locked.wait(5)
        try:
            self.publishers.enqueue()
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline and not self.stop.is_set():
                with connection.cursor() as cursor:
                    cursor.execute(HANDLER_WAITING, [HANDLER_STATEMENT])
                    waiting = cursor.fetchall()
                if waiting:
                    act(*self.random.choice(waiting))
                    return
                time.sleep(0.02)
        finally:
            locker.release.set()
            locker.join(20)

    def _free_a_seat(self) -> int | None:
        """Release a held seat of a section with learners in line (logged, like a
        learner's release); return its section."""
        in_line = WaitlistEntry.objects.filter(state=WaitlistEntry.State.WAITING).values(
            "section_id")
        hold = (SeatHold.objects.filter(section_id__in=in_line, status=SeatHold.Status.HELD,
                                        expires_at__gt=timezone.now())
                .order_by("?").values_list("pk", "section_id").first())
        if hold is None:
            return None
        try:
            if not release_hold(hold[0]):
                return None
        except ReservationError:  # confirmed meanwhile
            return None
        self.log.add("released", hold[0])
        return hold[1]


def publishing(cluster) -> list[int]:
    """Pids of the cluster's workers running a publisher right now."""
    if cluster.process is None:
        return []
    return [pid for pid in descendants(cluster.process.pid)
            if "processing" in title(pid) and PUBLISH_TASK in title(pid)]


def worker_of(client_port: int | None, pids: list[int]) -> int | None:
    """The one of ``pids`` whose TCP socket has ``client_port`` as its local port: the
    process at the other end of a backend's connection (None through a pooler, or over
    a Unix socket)."""
    if not client_port or client_port < 0:
        return None
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == client_port:
                inodes.add(f"socket:[{fields[9]}]")
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in inodes for fd in fds):
                return pid
        except OSError:
            continue
    return None


def drain(patience: float = 60) -> Counter:
    """Publish in this process until no event of the waitlist is pending, waiting out
    the back-off of those whose last attempt failed; return what the publisher did."""
    outcomes: Counter = Counter()
    pending = Event.objects.filter(name=SEAT_FREED, state=Event.State.PENDING)
    deadline = time.monotonic() + patience
    while pending.exists() and time.monotonic() < deadline:
        result = publish(100)
        outcomes.update(result.as_dict())
        if not result.handled:
            time.sleep(0.2)  # in back-off, or held by a cluster's publisher
    return outcomes


def figures(since: datetime, publishers: Publishers, drained: Counter,
            faults: PublisherFaults) -> dict:
    """What the clusters' publishers and the drain did."""
    runs = Task.objects.filter(group=PUBLISHER_GROUP, started__gte=since)
    done: Counter = Counter()
    for result in runs.filter(success=True).values_list("result", flat=True):
        done.update(result or {})
    return {
        "runs": {"enqueued": publishers.enqueued,
                 "succeeded": runs.filter(success=True).count(),
                 # Raised out of publish() (a database error outside any handler, or
                 # the record of a lost call failing too), then taken again after the
                 # retry: a connection terminated in a handler is that event's failed
                 # attempt (in_clusters) in a run that succeeds. A run whose worker
                 # was killed is taken again unrecorded.
                 "failed_then_ran_again": runs.filter(attempt_count__gt=1).count(),
                 "failed": runs.filter(success=False).count()},
        "samples": dict(publishers.samples),
        "in_clusters": {key: done[key] for key in ("delivered", "failed", "dead",
                                                   "skipped_busy")},
        "drained_after_the_soak": {key: drained[key] for key in ("delivered", "failed",
                                                                 "dead")},
        "faults": {**{kind: faults.hits[kind] for kind in KINDS},
                   "kills_of_the_worker_in_the_handler": faults.kills_mid_handler},
    }
