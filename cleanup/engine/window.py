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
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import timedelta

import structlog
from django.db import OperationalError, connection, transaction
from django.db.models import Q
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
from cleanup.models import Chunk, Halt, Run
from cleanup.policies import RANGE, Policy, find_policy

log = structlog.get_logger("cleanup.window")


def size(policy: Policy) -> int:
    """The policy's window: its own, or ``CLEANUP_WINDOW``."""
    return policy.window or conf.WINDOW


def lock_policy(policy_name: str) -> None:
    """Serialise planning per policy until the transaction ends."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"cleanup:{policy_name}"]
        )


@dataclass(frozen=True)
class TopUp:
    """What a top-up did: the chunks it planned, and the runs whose planning it wrote.
    Each of those is settled already, or has more to plan and stays running under the
    row lock the caller's transaction holds: settling one again would change nothing."""

    planned: int = 0
    settled: frozenset = frozenset()


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


def _top_up(policy: Policy, *, strict: bool = False, recheck: bool = True,
            opened: dict | None = None) -> TopUp:
    """``top_up``; ``opened``: the top-up the caller opened already (with a chunk's
    commit, ``transitions.to_committed``).

    Whatever fails here leaves the caller's transaction going on (a chunk's outcome
    commits whatever planning met): the ledger's functions keep a failure of their own
    writes inside them, and each step that sends a statement of its own (a run locked
    after the first, a count of the next range, a halt's record) runs in a savepoint.
    A run planned from its density, locked by the opening, sends none."""
    if opened is None:
        opened = transitions.open_top_up(policy.name, size(policy), sizing.LATEST,
                                         conf.LOCK_TIMEOUT_MS)
    if "error" in opened:
        if strict:
            raise OperationalError(opened["error"])
        # Another transaction kept the policy's planning lock or its oldest run longer
        # than the bound: the next chunk's end or the reconciler tops the window up.
        log.warning("topping the window up waited too long for a lock; left for later",
                    policy=policy.name, error=opened["error"])
        return TopUp()
    if not opened["runs"]:
        return TopUp()  # every run planned: no pressure to read
    flying, any_halt = opened["flying"], opened["halted"]
    signal = pressure.check(policy)  # each indicator in a savepoint of its own
    if any_halt or signal.level is Level.HALT:
        # Nothing to keep in line when no halt is open and the signal opens none.
        with transaction.atomic():
            halted = halts.record_pressure(policy.name, signal)
            if any(halt.reason in Halt.ENDED_BY_OPERATOR for halt in halted) or (
                    signal.level is Level.HALT):
                # Nothing new until the halt ends (cleanup.engine.halts); with nothing in
                # flight whose end would look again, a recheck task does.
                if recheck and signal.level is Level.HALT and not flying:
                    recheck_later(policy.name)
                return TopUp()
    slow = signal.level is Level.SLOW
    room = size(policy) - flying
    locked = opened["locked"]
    planned, settled = 0, set()
    for run_id in opened["runs"]:
        if room <= 0:
            break
        run = locked if locked is not None and str(locked.pk) == run_id else None
        try:
            with (nullcontext() if run is not None and _plans_unread(run, policy)
                  else transaction.atomic()):
                run = run or transitions.lock_run(run_id, sizing.LATEST)
                added, written = _top_up_run(run, policy, room, slow=slow)
        except Exception as exc:  # noqa: BLE001 - kept on the run, retried later
            if strict:
                raise
            log.error("planning the next chunk failed", policy=policy.name,
                      run_id=str(run_id), error=str(exc))
            transitions.record_planning_error(run_id, summary_of(exc))
            continue
        room -= added
        planned += added
        if written:
            settled.add(run.pk)
    return TopUp(planned, frozenset(settled))


def _plans_unread(run: Run, policy: Policy) -> bool:
    """Whether the run's next chunks are planned without reading the policy's table:
    ranges over the whole table whose density its latest chunks tell."""
    return (run.scheme == RANGE and policy.partition_column is None
            and sizing.density(run.latest_chunks) is not None)


class PlanningFailed(Exception):
    """The ledger refused a run's planning: its writes were kept out."""


def _top_up_run(run: Run | None, policy: Policy, room: int, *,
                slow: bool = False) -> tuple[int, bool]:
    """Plan up to ``room`` chunks of the run, locked for it (``transitions.lock_run``),
    write them with the run's planning and send them; return how many, and whether its
    planning was written (it is then settled, or running under this transaction's lock
    of its row with more to plan)."""
    # Checked again under its lock: a cancel that committed meanwhile is seen here.
    if run is None or run.state != Run.State.RUNNING or run.planned_all:
        return 0, False
    latest = run.latest_chunks
    run.next_chunk_size, run.max_span = sizing.next_size(run, policy, latest=latest, slow=slow)
    density = sizing.density(latest) if policy.partition_column is None else None
    send_now = transport.queue_shares_transaction()
    planned = []
    while len(planned) < room and not run.planned_all:
        chunk, following = planning.next_chunk(
            policy, run.frozen, run.scheme, frontier.load(run.frontier), run.next_chunk_size,
            span_end=run.span_end, max_span=run.max_span, density=density)
        run.frontier, run.planned_all = frontier.dump(following), following is None
        if chunk is None:
            run.planned_all, run.frontier = True, None
            break
        run.chunks_planned += 1
        run.candidates += chunk.rows
        planned.append({
            "chunk_id": run.chunks_planned, "planned_rows": chunk.rows,
            "rows_estimated": chunk.estimated,
            "state": Chunk.State.ENQUEUED if send_now else Chunk.State.PLANNED,
            "message": _message(run, run.chunks_planned, chunk,
                                partitioned=policy.partition_column is not None)})
    ready = (transport.outgoing((run.pk, chunk["chunk_id"], chunk["message"])
                                for chunk in planned) if send_now else None)
    if ready is not None:
        run.messages_sent += ready.per_run.total()
    in_ledger = ready is not None and transport.queue_in_ledger()
    # The run is settled there once it planned all.
    written = transitions.record_planned(run, planned, ready.rows if in_ledger else [])
    if "error" in written:
        raise PlanningFailed(written["error"])
    if ready is not None:
        queue_ids = written["queue"] if in_ledger else transport.insert_held(ready)
        transport.sent(ready, queue_ids, pk_of=lambda chunk_id: written["ids"][str(chunk_id)])
    elif planned:
        run_id = run.pk
        transaction.on_commit(lambda: transport.send_planned(run_id))
    return len(planned), True


def top_up_safely(policy: Policy, opened: dict | None = None) -> TopUp:
    """``top_up``, whose failure leaves the caller's transaction going on: a chunk's
    outcome commits even if planning the next one fails (the reconciler tops the window
    up again later). ``opened``: as for ``_top_up``."""
    try:
        return _top_up(policy, opened=opened)
    except Exception as exc:  # noqa: BLE001 - the outcome must commit whatever failed
        log.error("planning the next chunk failed", policy=policy.name, error=str(exc))
        return TopUp()


def top_up_now(policy: Policy) -> int:
    """``top_up`` in a transaction of its own."""
    with transaction.atomic():
        return top_up(policy)


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
