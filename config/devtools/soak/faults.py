"""Faults injected at random moments; only those that hit work in flight count."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from django.db import connection, connections, models, transaction
from django.db.models import Q
from django.utils import timezone

from cleanup.engine.dispatch import dispatch
from cleanup.engine.replay import replay
from cleanup.engine.transport import send
from cleanup.models import Chunk, Run
from cleanup.tasks import dispatch_scheduled
from config.devtools.processes import Cluster, title
from config.devtools.soak.traffic import TrafficLog
from reservations.exceptions import ReservationError
from reservations.models import Reminder, SeatHold
from reservations.policies import EXPIRE_HOLDS, MARK_REMINDERS_READY, PURGE_REMINDERS
from reservations.services import renew_hold

SIGKILL_BUSY_WORKER = "sigkill_busy_worker"
TERMINATE_BACKEND = "terminate_backend_mid_chunk"
RENEWAL_UNDER_WAIT = "renewal_committed_under_a_waiting_chunk"
DUPLICATE_DELIVERIES = "duplicate_deliveries"
TRIPLE_CONCURRENT = "triple_concurrent_delivery"
SCHEDULE_TWICE = "schedule_fired_twice"
CLUSTER_RESTART = "cluster_sigterm_restart"
POISON = "poison_chunk"
KINDS = (SIGKILL_BUSY_WORKER, TERMINATE_BACKEND, RENEWAL_UNDER_WAIT, DUPLICATE_DELIVERIES,
         TRIPLE_CONCURRENT, SCHEDULE_TWICE, CLUSTER_RESTART, POISON)
WAITING_STATEMENT = (
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
    "AND wait_event_type = 'Lock' AND query LIKE %s"
)


@dataclass(frozen=True)
class Target:
    """A policy whose chunks the faults hit in flight: the rows its statement wants
    (``wanted(now)``), the column naming a row's hold, and how that statement reads in
    pg_stat_activity."""

    policy: str
    model: type[models.Model]
    wanted: Callable[[datetime], Q]
    hold_column: str
    statement: str


# Planned work of every policy the learners race: the hold DELETE and the reminder UPDATE.
# A renewal or confirmation waiting on the same reminder also updates its table, but
# sets "state" to 'pending' or 'cancelled': a learner's backend is never the one hit.
TARGETS = (
    Target(EXPIRE_HOLDS, SeatHold,
           lambda now: Q(status=SeatHold.Status.HELD, expires_at__lte=now), "pk",
           f'DELETE FROM "{SeatHold._meta.db_table}"%'),
    Target(MARK_REMINDERS_READY, Reminder,
           lambda now: Q(state=Reminder.State.PENDING, due_at__lte=now), "hold_id",
           f'UPDATE "{Reminder._meta.db_table}" SET "state" = \'ready\'%'),
)
RACED = tuple(target.policy for target in TARGETS)


class Locker(threading.Thread):
    """Hold the row lock of one row an enqueued chunk covers, so that chunk's statement
    waits and its worker stays in flight until released.

    With a traffic log, the lock is a learner's renewal of that row's hold (the hold and
    its reminder locked, as renew_hold locks them), committed on release and logged:
    the statement that waited for it must then find the row no longer eligible."""

    def __init__(self, target: Target, pks: list[int], log: TrafficLog | None = None):
        super().__init__(daemon=True)
        self.target, self.pks, self.log = target, pks, log
        self.locked, self.release = threading.Event(), threading.Event()
        self.got = False
        self.renewed: SeatHold | None = None

    def run(self) -> None:
        try:
            with transaction.atomic():
                # Only a row the statement will want: still eligible.
                eligible = self.target.model.objects.filter(self.target.wanted(timezone.now()),
                                                            pk__in=self.pks)
                if self.log is None:
                    self.got = eligible.select_for_update(skip_locked=True).exists()
                else:
                    self.renewed = self._renew(eligible)
                    self.got = self.renewed is not None
                self.locked.set()
                self.release.wait(15)
            if self.renewed is not None:
                self.log.renewal(self.renewed, falling_due=False)
        finally:
            self.locked.set()
            connections.close_all()

    def _renew(self, eligible) -> SeatHold | None:
        hold_id = eligible.values_list(self.target.hold_column, flat=True).first()
        try:
            return None if hold_id is None else renew_hold(hold_id)
        except ReservationError:  # released, confirmed or deleted meanwhile
            return None


class Injector(threading.Thread):
    """Inject one fault after another until told to stop; count the ones that hit."""

    def __init__(self, clusters: list[Cluster], stop: threading.Event, seed: int,
                 log: TrafficLog):
        super().__init__(daemon=True)
        self.clusters, self.stop, self.random = clusters, stop, random.Random(seed)
        self.log = log
        self.hits: Counter = Counter()
        # Faults that hit the chunks of a policy, per policy.
        self.policies_hit: Counter = Counter()
        self.errors: list[str] = []

    def run(self) -> None:
        faults = {SIGKILL_BUSY_WORKER: self.sigkill_busy_worker,
                  TERMINATE_BACKEND: self.terminate_backend,
                  RENEWAL_UNDER_WAIT: self.renew_under_wait,
                  DUPLICATE_DELIVERIES: self.duplicates,
                  TRIPLE_CONCURRENT: self.triple_delivery,
                  SCHEDULE_TWICE: self.schedule_twice}
        try:
            while not self.stop.is_set():
                # Half the time the kind that hit least so far: the ones that need work
                # caught in flight miss more often, and each kind must hit a few times.
                kind = (min(faults, key=lambda each: (self.hits[each], self.random.random()))
                        if self.random.random() < 0.5 else self.random.choice(list(faults)))
                fault = faults[kind]
                try:
                    fault()
                except Exception as exc:  # noqa: BLE001 - a failed injection is reported
                    self.errors.append(f"{fault.__name__}: {exc!r}")
                self.stop.wait(self.random.uniform(0.2, 0.6))
        finally:
            connections.close_all()

    def _in_flight(self, act, *, renew: bool = False) -> None:
        """Lock a row that queued work of one of the raced policies covers (``renew``:
        by renewing its hold), and ``act`` on the backend pid of the statement that then
        waits on it (True if it hit); count nothing if no statement was caught.

        The work is an enqueued chunk sent once more, or, when nothing is queued and no
        run is in flight, a new run (its chunks cover every eligible row)."""
        target = self.random.choice(TARGETS)
        chunk = (Chunk.objects.filter(run__policy=target.policy, state=Chunk.State.ENQUEUED,
                                      run__scheme="items").order_by("?").first())
        if chunk is not None:
            rows = [pk for pk, _ in chunk.message["items"]]
        elif not Run.objects.filter(policy=target.policy, state=Run.State.RUNNING).exists():
            rows = list(target.model.objects.filter(target.wanted(timezone.now()))
                        .order_by("?").values_list("pk", flat=True)[:5])
        else:
            return
        locker = Locker(target, rows, self.log if renew else None)
        locker.start()
        locker.locked.wait(5)
        try:
            if not locker.got:
                return
            if chunk is not None:
                send([chunk])
                run_id = chunk.run_id
            else:
                run_id = dispatch(target.policy, scheme="items").run.pk
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not self.stop.is_set():
                with connection.cursor() as cursor:
                    cursor.execute(WAITING_STATEMENT, [target.statement])
                    pids = [pid for (pid,) in cursor.fetchall()]
                if pids:
                    if act(self.random.choice(pids), run_id):
                        self.policies_hit[target.policy] += 1
                    return
                time.sleep(0.02)
        finally:
            locker.release.set()
            locker.join(20)

    def sigkill_busy_worker(self) -> None:
        def kill(backend_pid: int, run_id) -> bool:
            busy = [pid for cluster in self.clusters for pid in cluster.busy_workers()]
            # A worker's title names the run of its chunk: the one held in flight first.
            held = [pid for pid in busy if f"[{run_id}]" in title(pid)]
            if busy:
                os.kill(self.random.choice(held or busy), signal.SIGKILL)
                self.hits[SIGKILL_BUSY_WORKER] += 1
            return bool(busy)

        self._in_flight(kill)

    def terminate_backend(self) -> None:
        def terminate(backend_pid: int, run_id) -> bool:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [backend_pid])
                terminated = cursor.fetchone()[0]
            if terminated:
                self.hits[TERMINATE_BACKEND] += 1
            return terminated

        self._in_flight(terminate)

    def renew_under_wait(self) -> None:
        """Commit a renewal that a chunk's DELETE or UPDATE is waiting for (invariant 2:
        the statement re-checks the renewed row and leaves it)."""
        def commit(backend_pid: int, run_id) -> bool:
            self.hits[RENEWAL_UNDER_WAIT] += 1  # released, so committed, just after
            return True

        self._in_flight(commit, renew=True)

    def duplicates(self) -> None:
        """Re-send a whole run with its own cutoff: every chunk delivered again."""
        run = (Run.objects.filter(policy=self.random.choice(RACED))
               .exclude(state=Run.State.CANCELLED).order_by("?").first())
        if run is not None and replay(run.pk).resent:
            self.hits[DUPLICATE_DELIVERIES] += 1
            self.policies_hit[run.policy] += 1

    def triple_delivery(self) -> None:
        policy = self.random.choice(RACED)
        chunk = Chunk.objects.filter(run__policy=policy).order_by("?").first()
        if chunk is not None:
            send([chunk, chunk, chunk])  # three copies at once
            self.hits[TRIPLE_CONCURRENT] += 1
            self.policies_hit[policy] += 1

    def schedule_twice(self) -> None:
        policy = self.random.choice((PURGE_REMINDERS, MARK_REMINDERS_READY))
        slot = timezone.now().replace(microsecond=0)
        first = dispatch_scheduled(policy, slot.isoformat())
        second = dispatch_scheduled(policy, slot.isoformat())
        if first is not None and first == second:
            self.hits[SCHEDULE_TWICE] += 1

    def restart_a_cluster(self) -> None:
        """SIGTERM one cluster mid-run and start it again."""
        cluster = self.random.choice(self.clusters)
        cluster.stop()
        cluster.start()
        cluster.restarts += 1
        self.hits[CLUSTER_RESTART] += 1
