"""Run the soak: seed, start two clusters, drive traffic and faults, then check."""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import timedelta

from django.db import connections
from django.db.models import Count, Sum
from django.test.utils import override_settings
from django.utils import timezone
from django_q.brokers import get_broker

from cleanup.engine import operations, window
from cleanup.engine.dispatch import dispatch
from cleanup.engine.reconcile import reconcile
from cleanup.engine.replay import replay
from cleanup.engine.transport import queue_shares_transaction
from cleanup.exceptions import CleanupError
from cleanup.models import Chunk, Run, WorkerHeartbeat
from cleanup.policies import get_policy, register_policy
from config.devtools.processes import Cluster
from config.devtools.soak import faults, publishers, reminders, waitlist
from config.devtools.soak.poison import POISON_CHANNEL, POISON_POLICY, register_poison_policy
from config.devtools.soak.traffic import Learners, TrafficLog
from config.devtools.wipe import wipe_reservations
from reservations import seeding
from reservations.models import ReminderAttempt, SeatHold, Section, Tenant
from reservations.policies import EXPIRE_HOLDS, MARK_REMINDERS_READY, PURGE_REMINDERS

SOAK_SETTINGS = "config.devtools.soak.settings"
# What the soak's clusters run with (config/devtools/soak/settings.py; tests/project/test_soak.py
# pins that both agree).
RETRY, TIMEOUT, MAX_UNFINISHED = 6, 4, 3
HOLD_MINUTES, REMINDER_LEAD_MINUTES, REMINDER_SEND_SECONDS = 15, 15 - 10 / 60, 2
EMAIL_BACKEND = "django.core.mail.backends.dummy.EmailBackend"
# An outbox event whose publisher was killed is taken again within seconds.
EVENT_BACKOFF_SECONDS, EVENT_BACKOFF_MAX_SECONDS = 1, 8
# The policies whose runs the soak dispatches, replays and checks.
DISPATCHED = (EXPIRE_HOLDS, PURGE_REMINDERS, MARK_REMINDERS_READY)


@dataclass
class SoakReport:
    broker: str
    duration: float
    faults: dict
    runs: dict
    chunks: dict
    traffic: dict
    figures: dict
    checks: dict = field(default_factory=dict)
    errors: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(self.checks.values())


def run_soak(*, duration: float, min_faults: int, seed: int, say) -> SoakReport:
    """Soak the pipeline for ``duration`` seconds; return what happened and the checks."""
    rng = random.Random(seed)
    lease = RETRY + TIMEOUT
    started_at = timezone.now()
    broker = "orm" if queue_shares_transaction() else "redis"
    with override_settings(Q_CLUSTER={"retry": RETRY, "timeout": TIMEOUT},
                           CLEANUP_MAX_UNFINISHED_DELIVERIES=MAX_UNFINISHED,
                           CLEANUP_CHUNK_BUDGET_MS=0,
                           RESERVATIONS_HOLD_MINUTES=HOLD_MINUTES,
                           RESERVATIONS_REMINDER_LEAD_MINUTES=REMINDER_LEAD_MINUTES,
                           RESERVATIONS_REMINDER_SEND_SECONDS=REMINDER_SEND_SECONDS,
                           EMAIL_BACKEND=EMAIL_BACKEND,
                           CLEANUP_EVENT_BACKOFF_SECONDS=EVENT_BACKOFF_SECONDS,
                           CLEANUP_EVENT_BACKOFF_MAX_SECONDS=EVENT_BACKOFF_MAX_SECONDS):
        seeded = _seed(duration)
        register_policy(replace(get_policy(EXPIRE_HOLDS), chunk_size=20))
        register_policy(replace(get_policy(PURGE_REMINDERS), chunk_size=50))
        register_policy(replace(get_policy(MARK_REMINDERS_READY), chunk_size=20))
        register_poison_policy()
        say(f"Seeded {seeded['holds']} holds with {seeded['hold_reminders']} reminders and "
            f"{seeded['reminders']} reminder attempts, {len(seeded['waitlisted'])} sections "
            f"with waitlists; broker {broker}; soaking for {duration:.0f} s.")

        env = {**os.environ, "DJANGO_SETTINGS_MODULE": SOAK_SETTINGS}
        # Two hosts' worth, each under its own name; host-b through a pooler if given.
        clusters = [Cluster(name, {**env, "CLEANUP_NODE_NAME": name, **through})
                    for name, through in (("host-a", {}), ("host-b", _through_pooler()))]
        try:
            for cluster in clusters:
                cluster.start()
            soaked = _soak(clusters, duration, min_faults, rng, seed, say, started_at,
                           seeded["waitlisted"])
            _settle(Run.objects.filter(created_at__gte=started_at), lease)
            # The last sender run, after the final mark run: every ready reminder goes.
            soaked.last_sender_run = reminders.send_the_rest()
            # After the final expire run: the seats it freed are offered too.
            soaked.waitlists.drain()
        finally:
            for cluster in clusters:
                cluster.stop()
        connections.close_all()
        return _report(broker, duration, started_at, seeded, soaked, min_faults, lease)


def _through_pooler() -> dict:
    """host-b's database: through a transaction pooler when SOAK_POOLER_URL names one
    (the soak's own process and host-a stay direct)."""
    url = os.environ.get("SOAK_POOLER_URL", "").strip()
    return {"DATABASE_URL": url, "DATABASE_POOLER": "transaction"} if url else {}


@dataclass
class Soaked:
    """What the soak's threads and loop leave for the report."""

    injector: faults.Injector
    log: TrafficLog
    waitlists: waitlist.WaitlistSoak
    final: dict
    poison_run: Run | None
    peaks: dict
    again: int
    sender_runs: int
    seconds: float  # traffic and faults ran: the duration, or longer (_soak)
    last_sender_run: Counter = field(default_factory=Counter)


def _soak(clusters, duration, min_faults, rng, seed, say, started_at, waitlisted):
    """Traffic, faults and dispatches for ``duration`` seconds, then the final runs.

    A fault that must catch work in flight can miss in a short soak: traffic and
    faults go on past ``duration`` (at most as long again) until each kind hit
    ``min_faults`` times; the report's checks still count what hit."""
    stop = threading.Event()
    log = TrafficLog()
    learners = [Learners(log, stop, seed + i) for i in range(3)]
    injector = faults.Injector(clusters, stop, seed, log)
    waitlists = waitlist.WaitlistSoak(waitlisted, clusters, log, stop, seed)
    window_probe = WindowProbe(stop)
    threads = (*learners, *waitlists.threads, injector, window_probe)
    for thread in threads:
        thread.start()
    poison_run = None
    restarted = False
    replayed: set = set()
    sender_runs = 0
    began = time.monotonic()
    deadline, last_call = began + duration, began + 2 * duration
    try:
        while time.monotonic() < deadline or (
                time.monotonic() < last_call and _short_of(
                    _fault_hits(injector, waitlists), min_faults)):
            # Like the scheduler, start a run only when the last one has finished;
            # then deliver each finished run once more (every chunk twice).
            for policy in (EXPIRE_HOLDS, MARK_REMINDERS_READY):
                if not Run.objects.filter(policy=policy, state=Run.State.RUNNING).exists():
                    dispatch(policy, scheme=rng.choice(["items", "items", "range"]))
            # Like its schedule, the sender runs whether or not a mark run is running.
            sender_runs += reminders.send_in_clusters(rng)
            _replay_finished(replayed, started_at)
            if poison_run is None:
                poison_run = dispatch(POISON_POLICY).run
                injector.hits[faults.POISON] += 1
            if not restarted and time.monotonic() > deadline - duration / 2:
                injector.restart_a_cluster()
                restarted = True
            reconcile()
            time.sleep(rng.uniform(1.0, 2.0))
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    seconds = time.monotonic() - began
    say(f"Traffic and faults stopped after {seconds:.0f} s; final runs, every run "
        "delivered once more.")
    final = {policy: dispatch(policy).run for policy in DISPATCHED}
    _settle(Run.objects.filter(pk__in=[r.pk for r in final.values()]), RETRY + TIMEOUT)
    again = _deliver_every_chunk_twice(replayed, started_at)
    return Soaked(injector, log, waitlists, final, poison_run, window_probe.peaks, again,
                  sender_runs, seconds)


def _fault_hits(injector: faults.Injector, waitlists: waitlist.WaitlistSoak) -> Counter:
    """How many times each fault kind hit, the publishers' faults included."""
    hits = Counter({kind: injector.hits.get(kind, 0) for kind in faults.KINDS})
    hits.update({kind: waitlists.faults.hits[kind] for kind in publishers.KINDS})
    return hits


def _short_of(hits: Counter, min_faults: int) -> list[str]:
    """The kinds caught in flight that hit fewer than ``min_faults`` times (a restart
    and the poison chunk are the soak's own doing, once each)."""
    return [kind for kind, n in hits.items()
            if kind not in (faults.CLUSTER_RESTART, faults.POISON) and n < min_faults]


class WindowProbe(threading.Thread):
    """Samples each policy's chunks in flight while the soak runs, and keeps the peak.

    Counted as the window counts them (unfinished chunks of running runs), leaving out
    chunks an operator's requeue or a replay sent again: those go out at once, on top of
    the window.
    """

    def __init__(self, stop: threading.Event):
        super().__init__(daemon=True)
        self.stop = stop
        self.peaks = dict.fromkeys(DISPATCHED, 0)

    def run(self) -> None:
        try:
            while not self.stop.wait(0.05):
                counts = (Chunk.objects.filter(run__policy__in=self.peaks,
                                               run__state=Run.State.RUNNING,
                                               state__in=Chunk.UNFINISHED, dead_letters=0)
                          .values_list("run__policy").annotate(n=Count("pk")).order_by())
                for policy, n in counts:
                    self.peaks[policy] = max(self.peaks[policy], n)
        finally:
            connections.close_all()


def _replay_finished(replayed: set, since) -> None:
    finished = Run.objects.filter(policy__in=DISPATCHED, created_at__gte=since).exclude(
        state__in=[Run.State.RUNNING, Run.State.CANCELLED]).exclude(pk__in=replayed)
    for run in finished:
        replay(run.pk)
        replayed.add(run.pk)


def _short_of_two(since):
    """The soak's chunks (the poison policy's aside) delivered fewer than two times."""
    return Chunk.objects.filter(run__created_at__gte=since, deliveries__lt=2).exclude(
        run__policy=POISON_POLICY)


def _deliver_every_chunk_twice(replayed: set, since) -> int:
    """Replay the runs not replayed yet, and wait until every chunk had a second delivery.

    With Redis, a message taken by a worker the soak killed is gone, and its chunk being
    finished, the reconciler does not send it again: such a run is replayed once more.
    A replay refuses a run whose re-sent chunk is still unfinished (a dead letter the
    first replay reopened, whose message was lost): the reconciler re-sends that one,
    as an operator's would. Returns how many runs were replayed again.
    """
    _replay_finished(replayed, since)
    again = 0
    for _ in range(3):
        left, still_since = None, time.monotonic()
        while time.monotonic() - still_since < RETRY + TIMEOUT:
            count = _short_of_two(since).count()
            if count == 0:
                return again
            if count != left:
                left, still_since = count, time.monotonic()
            reconcile()
            time.sleep(0.5)
        for run_id in set(_short_of_two(since).values_list("run_id", flat=True)):
            try:
                replay(run_id)
            except CleanupError:
                continue  # refused, nothing sent: still in flight, the reconciler's
            again += 1
    return again


def _settle(runs, lease: float) -> None:
    """Wait until the runs finish and the queue drains, as long as work progresses."""
    broker = get_broker()
    progress, still_since = None, time.monotonic()
    while True:
        queued = (broker.queue_size() or 0) + (broker.lock_size() or 0)
        unfinished = Chunk.objects.filter(run__in=runs, state__in=Chunk.UNFINISHED).count()
        if not queued and not runs.filter(state=Run.State.RUNNING).exists():
            return
        if (queued, unfinished) != progress:
            progress, still_since = (queued, unfinished), time.monotonic()
        elif time.monotonic() - still_since > 3 * lease + 10:
            return
        reconcile()
        time.sleep(1)


def _seed(duration: float) -> dict:
    # Runs left running from before would add their work to the soak's figures.
    operations.cancel(Run.objects.filter(state=Run.State.RUNNING).values_list("pk", flat=True),
                      actor="soak")
    wipe_reservations()
    counts = seeding.seed(tenants=3, expired=600, active=0, confirmed=50, attempts=1500,
                          random_seed=7, progress=lambda *a: None)
    # Holds that expire while the soak runs, so every run finds fresh work; their
    # reminders are overdue (the sender sends or cancels them as the holds expire).
    now = timezone.now()
    sections = list(Section.objects.all())
    expiring = int(40 * duration)
    expiring_holds = SeatHold.objects.bulk_create(
        SeatHold(tenant_id=s.tenant_id, section=s, learner_ref=f"expiring-{i}",
                 expires_at=now + timedelta(seconds=duration * i / expiring))
        for i, s in ((i, sections[i % len(sections)]) for i in range(expiring))
    )
    reminded = reminders.remind(expiring_holds)
    # Holds whose reminders fall due while the soak runs.
    falling_due, their_reminders = reminders.seed_falling_due(duration, now)
    waitlisted = waitlist.seed(duration, now)
    tenant = Tenant.objects.first()
    ReminderAttempt.objects.create(tenant=tenant, hold_id=0, learner_ref="poison",
                                   channel=POISON_CHANNEL, sent_at=now - timedelta(hours=1))
    return {"holds": (counts["expired"] + counts["confirmed"] + expiring + falling_due
                      + waitlisted["holds"]),
            "hold_reminders": (counts["reminders"] + reminded + their_reminders
                               + waitlisted["reminders"]),
            "reminders": counts["attempts"], "waitlisted": waitlisted["sections"]}


def _report(broker, duration, started_at, seeded, soaked: Soaked, min_faults,
            lease) -> SoakReport:
    log, injector, poison_run, peaks = soaked.log, soaked.injector, soaked.poison_run, soaked.peaks
    now = timezone.now()
    runs = Run.objects.filter(created_at__gte=started_at)
    chunks = Chunk.objects.filter(run__in=runs)
    ledger = dict(chunks.values_list("run__policy").annotate(n=Sum("rows_deleted")).order_by())
    holds_now = SeatHold.objects.count()
    # Holds come from the seeding, the learners and the waitlists' offers, and go by
    # cleanup, the learners' releases and their leaving the line with an offer.
    released = log.released | waitlist.released_by_leaving(started_at)
    holds_made = seeded["holds"] + len(log.created) + waitlist.offers_made()
    holds_gone = holds_made - len(released) - holds_now
    # The seeded attempts and the poison one; the sender's (each with its Message-ID)
    # are recent, so no purge may touch them: a purge that did shows as a mismatch.
    reminders_gone = (seeded["reminders"] + 1
                      - ReminderAttempt.objects.filter(message_id="").count())
    kept = (log.renewed | log.confirmed) - released
    lost = len(kept) - SeatHold.objects.filter(pk__in=kept).count()
    completed = runs.filter(policy=EXPIRE_HOLDS).exclude(state=Run.State.RUNNING)
    left_behind = sum(
        SeatHold.objects.filter(status="held", expires_at__lte=run.cutoff).count()
        for run in completed.filter(state=Run.State.COMPLETED).order_by("-cutoff")[:1]
    )
    allowed = timedelta(seconds=lease + RETRY)
    overdue = chunks.filter(state__in=Chunk.UNFINISHED, planned_at__lt=now - allowed).count()
    poison = Chunk.objects.filter(run=poison_run).first() if poison_run else None
    once = chunks.exclude(run__policy=POISON_POLICY).filter(deliveries__lt=2).count()
    hits = _fault_hits(injector, soaked.waitlists)
    beating = set(WorkerHeartbeat.objects.filter(beat_at__gte=started_at)
                  .values_list("host", flat=True))
    report = SoakReport(
        broker=broker, duration=duration, faults=dict(hits),
        runs=dict(Counter(runs.values_list("state", flat=True))),
        chunks=dict(Counter(chunks.values_list("state", flat=True))),
        traffic={"created": len(log.created), "renewed": len(log.renewed),
                 "renewals": len(log.renewals),
                 "confirmed": len(log.confirmed), "released": len(log.released),
                 "refused": log.refused},
        figures={
            "soaked_seconds": round(soaked.seconds, 1),
            "renewed_or_confirmed_then_deleted": lost,
            "eligible_at_cutoff_left_after_completion": left_behind,
            "holds_deleted_ledger": ledger.get(EXPIRE_HOLDS, 0),
            "holds_actually_gone": holds_gone,
            "reminders_deleted_ledger": ledger.get(PURGE_REMINDERS, 0),
            "reminders_actually_gone": reminders_gone,
            "chunks_not_terminal_in_time": overdue,
            "runs_still_running": runs.filter(state=Run.State.RUNNING).count(),
            "chunks_delivered_only_once": once,
            "runs_replayed_again_after_a_lost_message": soaked.again,
            "chunks_reconciled": chunks.aggregate(n=Sum("reconciles"))["n"] or 0,
            "poison_chunk": {
                "state": poison.state, "failure_class": poison.failure_class,
                "deliveries": poison.deliveries, "run_id": str(poison.run_id),
                "run_state": Run.objects.get(pk=poison.run_id).state,
            } if poison else None,
            "final_runs": [str(r.pk) for r in soaked.final.values()],
            "faults_on_chunks_by_policy": dict(injector.policies_hit),
            "chunks_in_flight_peak": peaks,
            "clusters_beating": sorted(beating),
            "host_b_database": "through a pooler" if _through_pooler() else "direct",
            "window": {name: window.size(get_policy(name)) for name in peaks},
        },
        errors=injector.errors + soaked.waitlists.faults.errors,
    )
    figures = report.figures
    figures["reminders"], reminder_checks = reminders.figures_and_checks(
        log, seeded["hold_reminders"], started_at, soaked.final[MARK_REMINDERS_READY],
        soaked.last_sender_run, soaked.sender_runs)
    figures["waitlist"], waitlist_checks = soaked.waitlists.figures_and_checks(started_at)
    report.checks = {
        "no renewed or confirmed hold was deleted": lost == 0,
        "no hold eligible at the last completed cutoff was left": left_behind == 0,
        "ledger rows deleted match holds gone": figures["holds_deleted_ledger"] == holds_gone,
        "ledger rows deleted match reminders gone":
            figures["reminders_deleted_ledger"] == reminders_gone,
        "every chunk terminal within lease plus retry": overdue == 0,
        "every run reached a terminal state": figures["runs_still_running"] == 0,
        "every chunk was delivered at least twice": once == 0,
        "never more chunks of a policy in flight than its window": all(
            peak <= figures["window"][name] for name, peak in peaks.items()),
        "each cluster's heartbeat shows": {"host-a", "host-b"} <= beating,
        "the window filled (chunks were planned as the runs went)":
            peaks[EXPIRE_HOLDS] > 1 and peaks[MARK_REMINDERS_READY] > 1,
        "poison chunk dead-lettered after the limit, its run identified": bool(
            poison and poison.state == Chunk.State.DEAD_LETTERED
            and poison.failure_class == Chunk.FailureClass.POISON
            and poison.deliveries >= MAX_UNFINISHED
            and figures["poison_chunk"]["run_state"] == Run.State.COMPLETED_WITH_DEAD_LETTERS),
        "faults hit the chunks of every policy the learners race":
            all(injector.policies_hit[policy] > 0 for policy in faults.RACED),
        f"at least {min_faults} of each fault hit work in flight":
            not _short_of(hits, min_faults)
            and hits[faults.CLUSTER_RESTART] >= 1 and hits[faults.POISON] == 1,
        **reminder_checks,
        **waitlist_checks,
    }
    if broker == "redis":
        report.checks["the reconciler re-sent lost messages"] = figures["chunks_reconciled"] >= 1
    return report
