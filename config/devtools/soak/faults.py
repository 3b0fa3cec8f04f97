"""Faults injected at random moments; only those that hit work in flight count."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter

from django.db import connection, connections, transaction
from django.utils import timezone

from cleanup.dispatch import dispatch
from cleanup.models import Chunk, Run
from cleanup.replay import replay
from cleanup.tasks import dispatch_scheduled
from cleanup.transport import send
from config.devtools.processes import Cluster
from reservations.models import SeatHold
from reservations.policies import EXPIRE_HOLDS, PURGE_REMINDERS

SIGKILL_BUSY_WORKER = "sigkill_busy_worker"
TERMINATE_BACKEND = "terminate_backend_mid_chunk"
DUPLICATE_DELIVERIES = "duplicate_deliveries"
TRIPLE_CONCURRENT = "triple_concurrent_delivery"
SCHEDULE_TWICE = "schedule_fired_twice"
CLUSTER_RESTART = "cluster_sigterm_restart"
POISON = "poison_chunk"
KINDS = (SIGKILL_BUSY_WORKER, TERMINATE_BACKEND, DUPLICATE_DELIVERIES, TRIPLE_CONCURRENT,
         SCHEDULE_TWICE, CLUSTER_RESTART, POISON)
WAITING_DELETE = (
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
    "AND wait_event_type = 'Lock' AND query LIKE %s"
)


class Locker(threading.Thread):
    """Hold the row lock of one hold an enqueued chunk covers, so that chunk's DELETE
    waits and its worker stays in flight until released."""

    def __init__(self, hold_pks: list[int]):
        super().__init__(daemon=True)
        self.hold_pks = hold_pks
        self.locked, self.release = threading.Event(), threading.Event()
        self.got = False

    def run(self) -> None:
        try:
            with transaction.atomic():
                # Only a hold a DELETE will want: still held and expired.
                self.got = SeatHold.objects.select_for_update(skip_locked=True).filter(
                    pk__in=self.hold_pks, status=SeatHold.Status.HELD,
                    expires_at__lte=timezone.now()).exists()
                self.locked.set()
                self.release.wait(15)
        finally:
            self.locked.set()
            connections.close_all()


class Injector(threading.Thread):
    """Inject one fault after another until told to stop; count the ones that hit."""

    def __init__(self, clusters: list[Cluster], stop: threading.Event, seed: int):
        super().__init__(daemon=True)
        self.clusters, self.stop, self.random = clusters, stop, random.Random(seed)
        self.hits: Counter = Counter()
        self.errors: list[str] = []

    def run(self) -> None:
        faults = [self.sigkill_busy_worker, self.terminate_backend, self.duplicates,
                  self.triple_delivery, self.schedule_twice]
        try:
            while not self.stop.is_set():
                fault = self.random.choice(faults)
                try:
                    fault()
                except Exception as exc:  # noqa: BLE001 - a failed injection is reported
                    self.errors.append(f"{fault.__name__}: {exc!r}")
                self.stop.wait(self.random.uniform(0.2, 0.6))
        finally:
            connections.close_all()

    def _in_flight(self, act) -> None:
        """Lock a hold that queued work covers, and ``act`` on the backend pid of the
        DELETE that then waits on it; count nothing if no DELETE was caught.

        The work is an enqueued chunk sent once more, or, when nothing is queued and no
        run is in flight, a new run (its chunks cover every expired hold)."""
        chunk = (Chunk.objects.filter(run__policy=EXPIRE_HOLDS, state=Chunk.State.ENQUEUED,
                                      run__scheme="items").order_by("?").first())
        if chunk is not None:
            holds = [pk for pk, _ in chunk.message["items"]]
        elif not Run.objects.filter(policy=EXPIRE_HOLDS, state=Run.State.RUNNING).exists():
            holds = list(SeatHold.objects.filter(
                status=SeatHold.Status.HELD, expires_at__lte=timezone.now(),
            ).order_by("?").values_list("pk", flat=True)[:5])
        else:
            return
        locker = Locker(holds)
        locker.start()
        locker.locked.wait(5)
        try:
            if not locker.got:
                return
            if chunk is not None:
                send([chunk])
            else:
                dispatch(EXPIRE_HOLDS, scheme="items")
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not self.stop.is_set():
                with connection.cursor() as cursor:
                    cursor.execute(WAITING_DELETE, [f'DELETE FROM "{SeatHold._meta.db_table}"%'])
                    pids = [pid for (pid,) in cursor.fetchall()]
                if pids:
                    act(self.random.choice(pids))
                    return
                time.sleep(0.02)
        finally:
            locker.release.set()
            locker.join(20)

    def sigkill_busy_worker(self) -> None:
        def kill(backend_pid: int) -> None:
            busy = [pid for cluster in self.clusters for pid in cluster.busy_workers()]
            if busy:
                os.kill(self.random.choice(busy), signal.SIGKILL)
                self.hits[SIGKILL_BUSY_WORKER] += 1

        self._in_flight(kill)

    def terminate_backend(self) -> None:
        def terminate(backend_pid: int) -> None:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [backend_pid])
                if cursor.fetchone()[0]:
                    self.hits[TERMINATE_BACKEND] += 1

        self._in_flight(terminate)

    def duplicates(self) -> None:
        """Re-send a whole run with its own cutoff: every chunk delivered again."""
        run = (Run.objects.filter(policy=EXPIRE_HOLDS).exclude(state=Run.State.CANCELLED)
               .order_by("?").first())
        if run is not None and replay(run.pk).resent:
            self.hits[DUPLICATE_DELIVERIES] += 1

    def triple_delivery(self) -> None:
        chunk = Chunk.objects.filter(run__policy=EXPIRE_HOLDS).order_by("?").first()
        if chunk is not None:
            send([chunk, chunk, chunk])  # three copies at once
            self.hits[TRIPLE_CONCURRENT] += 1

    def schedule_twice(self) -> None:
        slot = timezone.now().replace(microsecond=0)
        first = dispatch_scheduled(PURGE_REMINDERS, slot.isoformat())
        second = dispatch_scheduled(PURGE_REMINDERS, slot.isoformat())
        if first is not None and first == second:
            self.hits[SCHEDULE_TWICE] += 1

    def restart_a_cluster(self) -> None:
        """SIGTERM one cluster mid-run and start it again."""
        cluster = self.random.choice(self.clusters)
        cluster.stop()
        cluster.start()
        cluster.restarts += 1
        self.hits[CLUSTER_RESTART] += 1
