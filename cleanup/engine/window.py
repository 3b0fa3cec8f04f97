"""The window: at most W chunks of a policy in flight, each next one planned as one ends.

A run plans its chunks as it goes. Dispatch plans the first window; then whichever
transaction ends a chunk (its commit, its dead letter, an operator's discard or
cancel) tops the window up again, so W chains advance the frontier and one chunk's
fate never stops the run. The runs of one policy share its window: a second run waits
for room, oldest first. Every chunk is a ledger row with its message before it is
sent; with django-q2's ORM broker the message commits with the transaction that
planned it, with another broker it is sent after that commit (and the reconciler
sends one that a crash in between left planned).

A run its dispatching process applies (``--sync``) is planned and sent like any other;
that process takes its messages from the queue (cleanup.engine.in_process).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from datetime import timedelta

import structlog
from django.db import connection, transaction
from django.db.models import Exists, Q
from django.utils import timezone
from django_q.tasks import async_task

from cleanup.conf import conf
from cleanup.engine import (
    frontier,
    halts,
    leases,
    messages,
    planning,
    pressure,
    sizing,
    transitions,
    transport,
)
from cleanup.engine.pressure import Level
from cleanup.exceptions import summary_of
from cleanup.expressions import count_of
from cleanup.models import Chunk, Halt, Run
from cleanup.policies import Policy, find_policy

log = structlog.get_logger("cleanup.window")


def size(policy: Policy) -> int:
    """The policy's window: its own, or ``CLEANUP_WINDOW``."""
    return policy.window or conf.WINDOW


def _unfinished(policy_name: str):
    return Chunk.objects.filter(run__policy=policy_name, run__state=Run.State.RUNNING,
                                state__in=Chunk.UNFINISHED)


def lock_policy(policy_name: str) -> None:
    """Serialise planning per policy until the transaction ends."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"cleanup:{policy_name}"]
        )


@dataclass(frozen=True)
class TopUp:
    """What a top-up did: the chunks it planned, and the runs it planned for that have
    more to plan. Those runs' rows stay locked by the caller's transaction, so each stays
    running until it ends: settling one there would change nothing."""

    planned: int = 0
    still_planning: frozenset = frozenset()


def top_up(policy: Policy, *, strict: bool = False, recheck: bool = True) -> int:
    """Plan and send chunks of the policy's running runs, oldest run first, until W are
    in flight or every run is planned; return how many were planned.

    Runs in the caller's transaction, under the policy's planning lock, so two chunks
    ending at once cannot plan the same range twice or overfill the window. A run whose
    planning fails is left with the error and skipped, so it cannot block the others;
    ``strict`` (dispatch) raises instead, so the dispatch writes nothing. A policy
    the database's pressure halts plans nothing; with nothing of it in flight, a
    recheck task is sent to look again (``recheck`` False: the caller is that task).
    """
    return _top_up(policy, strict=strict, recheck=recheck).planned


def _top_up(policy: Policy, *, strict: bool = False, recheck: bool = True) -> TopUp:
    lock_policy(policy.name)
    # With each run, in the same statement, the policy's chunks in flight and whether it
    # has a halt open (each subquery is computed once): a chunk's end reads no more.
    unfinished = _unfinished(policy.name)
    runs = list(Run.objects.filter(policy=policy.name, state=Run.State.RUNNING,
                                   planned_all=False)
                .annotate(flying=count_of(unfinished),
                          halted=Exists(Halt.objects.filter(policy=policy.name,
                                                            ended_at__isnull=True)))
                .order_by("created_at", "pk")
                .values_list("pk", "flying", "halted"))
    if not runs:
        return TopUp()  # every run planned: no pressure to read
    _, flying, any_halt = runs[0]
    signal = pressure.check(policy)
    # Nothing to keep in line when no halt is open and the signal opens none.
    halted = (halts.record_pressure(policy.name, signal)
              if any_halt or signal.level is Level.HALT else [])
    if any(halt.reason in Halt.ENDED_BY_OPERATOR for halt in halted) or (
            signal.level is Level.HALT):
        # Nothing new until the halt ends (cleanup.engine.halts); with nothing in flight
        # whose end would look again, a recheck task does.
        if recheck and signal.level is Level.HALT and not flying:
            recheck_later(policy.name)
        return TopUp()
    slow = signal.level is Level.SLOW
    room = size(policy) - flying
    planned, still_planning = 0, set()
    for run_id, *_ in runs:
        if room <= 0:
            break
        try:
            with transaction.atomic():
                added, more = _top_up_run(run_id, policy, room, slow=slow)
        except Exception as exc:  # noqa: BLE001 - kept on the run, retried later
            if strict:
                raise
            log.error("planning the next chunk failed", policy=policy.name,
                      run_id=str(run_id), error=str(exc))
            transitions.record_planning_error(run_id, summary_of(exc))
            continue
        room -= added
        planned += added
        if more:
            still_planning.add(run_id)
    return TopUp(planned, frozenset(still_planning))


def _top_up_run(run_id, policy: Policy, room: int, *, slow: bool = False) -> tuple[int, bool]:
    """Plan up to ``room`` chunks of the run; return how many, and whether it has more
    to plan (it is then running, under this transaction's lock of its row)."""
    # Locked, then checked again: a cancel that committed meanwhile is seen here. Its
    # latest chunks' pace comes with it, for its next size.
    run = sizing.with_latest_chunks(Run.objects.select_for_update(of=("self",))).get(pk=run_id)
    if run.state != Run.State.RUNNING or run.planned_all:
        return 0, False
    run.next_chunk_size, run.max_span = sizing.next_size(run, policy, latest=run.latest_chunks,
                                                         slow=slow)
    added = 0
    while added < room and not run.planned_all:
        if _plan_next(run, policy):
            added += 1
    transitions.record_planning(run)
    if run.planned_all:
        # Its last chunk may have finished already (or it found nothing): settled here.
        transitions.settle_run(run.pk)
    return added, not run.planned_all


def top_up_safely(policy: Policy) -> TopUp:
    """``top_up`` in a savepoint: a chunk's outcome commits even if planning the next
    one fails (the reconciler tops the window up again later)."""
    try:
        with transaction.atomic():
            return _top_up(policy)
    except Exception as exc:  # noqa: BLE001 - the outcome must commit whatever failed
        log.error("planning the next chunk failed", policy=policy.name, error=str(exc))
        return TopUp()


def top_up_now(policy: Policy) -> int:
    """``top_up`` in a transaction of its own."""
    with transaction.atomic():
        return top_up(policy)


def _plan_next(run: Run, policy: Policy) -> bool:
    """Plan the chunk at the run's frontier and send it; False if nothing was left."""
    chunk, following = planning.next_chunk(
        policy, run.frozen, run.scheme, frontier.load(run.frontier), run.next_chunk_size,
        span_end=run.span_end, max_span=run.max_span,
    )
    run.frontier = frontier.dump(following)
    run.planned_all = following is None
    if chunk is None:
        run.planned_all, run.frontier = True, None
        return False
    chunk_id = run.chunks_planned + 1
    now = timezone.now()
    send_now = transport.queue_shares_transaction()
    row = transitions.plan_chunk(
        run, chunk_id,
        _message(run, chunk_id, chunk, partitioned=policy.partition_column is not None),
        chunk.rows, send_now=send_now, now=now,
    )
    if send_now:
        # Saved with the run's planning (record_planning).
        run.messages_sent += transport.send([row], count=False)
    else:
        run_id = run.pk
        transaction.on_commit(lambda: transport.send_planned(run_id))
    run.chunks_planned = chunk_id
    run.candidates += chunk.rows
    return True


def _message(run: Run, chunk_id: int, planned: planning.PlannedChunk, *,
             partitioned: bool) -> dict:
    if planned.items is not None:
        return messages.items_message(run, chunk_id, planned.items)
    return messages.range_message(run, chunk_id, planned.partition, planned.start_id,
                                  planned.end_id, partitioned=partitioned)


RECHECK_TASK = "cleanup.tasks.recheck_pressure"
# A recheck task looks this long at most, then hands over to a fresh one (well inside
# the queue's timeout), and never more often than every MIN_RECHECK_SECONDS.
RECHECK_FOR_SECONDS = 60
MIN_RECHECK_SECONDS = 0.5
# Its lease outlasts one look by this much: a recheck task killed mid-way holds the
# policy's rechecks back no longer than that.
RECHECK_LEASE_MARGIN_SECONDS = 30


def recheck(policy_name: str) -> int:
    """Read a halted policy's pressure again every ``CLEANUP_PRESSURE_CHECK_SECONDS`` and
    top its window up once the halt clears; return the chunks then planned. A task at
    a time per policy (under a lease); one still halted after ``RECHECK_FOR_SECONDS``
    sends its successor."""
    interval = _recheck_interval()
    lease, owner = _recheck_lease(policy_name), f"{leases.this_process()}:{uuid.uuid4().hex[:8]}"
    if not leases.take(lease, owner, interval + RECHECK_LEASE_MARGIN_SECONDS):
        return 0  # another worker is at it
    try:
        deadline = time.monotonic() + RECHECK_FOR_SECONDS
        while time.monotonic() < deadline:
            time.sleep(interval)
            if not leases.renew(lease, owner, interval + RECHECK_LEASE_MARGIN_SECONDS):
                return 0  # lapsed while this worker was stopped: another took over
            pressure.forget(policy_name)
            if (policy := find_policy(policy_name)) is None:
                return 0  # removed by a deploy: nothing to plan for it
            with transaction.atomic():
                planned = top_up(policy, recheck=False)
                halted = (Halt.objects.filter(policy=policy_name, ended_at__isnull=True)
                        .exclude(reason__in=Halt.ENDED_BY_OPERATOR).exists())
            if not halted:
                return planned
    finally:
        leases.release(lease, owner)
    async_task(RECHECK_TASK, policy_name)
    return 0


def recheck_later(policy_name: str) -> None:
    """Have a worker read the halted policy's pressure again until it clears (and plan
    then), unless one is at it already; sent with this transaction (ORM broker) or after."""
    if leases.live([_recheck_lease(policy_name)],
                   _recheck_interval() + RECHECK_LEASE_MARGIN_SECONDS):
        return
    if transport.queue_shares_transaction():
        async_task(RECHECK_TASK, policy_name)
    else:
        transaction.on_commit(lambda: async_task(RECHECK_TASK, policy_name))


def _recheck_interval() -> float:
    return max(float(conf.PRESSURE_CHECK_SECONDS), MIN_RECHECK_SECONDS)


def _recheck_lease(policy_name: str) -> str:
    return f"recheck:{policy_name}"


def waiting_behind(run: Run):
    """The oldest other running run of the policy with chunks in flight: the one a run
    that got no room in the window waits behind."""
    return (Run.objects.filter(policy=run.policy, state=Run.State.RUNNING,
                               chunks__state__in=Chunk.UNFINISHED)
            .exclude(pk=run.pk).order_by("created_at", "pk")
            .values_list("pk", flat=True).first())


def run_to_join(policy: Policy, within: timedelta) -> Run | None:
    """A running run of the policy that a new slot joins: one started within
    ``within``, or one still planning (its chunks keep coming, whatever its age)."""
    return (
        Run.objects.filter(policy=policy.name, state=Run.State.RUNNING)
        .filter(Q(created_at__gte=timezone.now() - within)
                | Q(planned_all=False, planning_error=""))
        .order_by("-created_at")
        .first()
    )
