"""Halts: times a policy plans and sends nothing new.

An operator pauses a policy (``cleanup_pause``, cleanup.engine.operations), the
database's pressure halts it (cleanup.engine.pressure: a standby replaying too far
behind, a failing indicator), or its run's chunks mostly fail (``weigh_failing``).
While a halt is open, topping up the window plans nothing for the policy's runs
(cleanup.engine.window), a dispatch creates its run and says it is halted, and
scheduled slots still coalesce into the run in flight. Chunks already sent finish;
nothing is dead-lettered, retried or failed for being halted, and the runs stay running.
A pause and a failing halt end when the policy is resumed; a pressure halt when its
signal clears, the window then refilling by itself.

Every halt is kept, ended or not, with its reason, its figures and who began and ended
it: the ledger of why a policy was not working. This module is its one writer: the
pressure's halts and the failing policy's here, the operator's pause and resume
(cleanup.engine.operations) through ``begin`` and ``end``.

A failing policy: a chunk that fails for good is dead-lettered and the run goes on, so
one bad row never stops the work. But a predicate the database rejects, or a table
locked for an hour, fails every chunk alike: the run would dead-letter chunk after chunk
to the end of its backlog. So each dead letter weighs the policy's last
``CLEANUP_FAILING_CHUNKS`` ended chunks (committed or dead-lettered), across its runs:
minutely runs of a chunk or two fail alike too. Once more than half of them were
dead-lettered, the policy is halted with reason ``failing`` and the failures' most
common cause. Nothing new is planned; the chunks in flight finish. A run with chunks
left to plan stays running where it stopped; a run whose chunks were all planned ends
as they end (``completed_with_dead_letters``), its dead letters waiting for a requeue
or a discard. Only an operator's resume ends the halt, and the chunks ended before it
are not weighed again, so the work goes on from there and halts again only if it fails
again.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta

import structlog
from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from cleanup.conf import conf
from cleanup.display import duration
from cleanup.engine.pressure import Level, Signal
from cleanup.models import Chunk, Halt, Run

log = structlog.get_logger("cleanup.halts")
failing_log = structlog.get_logger("cleanup.failing")  # the name operators filter on

ENDED = (*Chunk.DONE, Chunk.State.DEAD_LETTERED)


@dataclass(frozen=True)
class HaltChange:
    halt: Halt
    changed: bool  # False: it was already so (a second pause, a second resume)
    planned: int = 0  # chunks planned at once on resuming


def record_pressure(policy_name: str, signal: Signal) -> list[Halt]:
    """Keep the ledger in line with the policy's pressure signal, in the caller's
    transaction (under the policy's planning lock): a halt opens when a signal halts,
    its figures follow the latest reading, and it ends once the signal clears or names
    another reason. Returns the policy's halts that were open (read first)."""
    halted = open_halts(policy_name)
    now = timezone.now()
    pressure = [halt for halt in halted if halt.reason not in Halt.ENDED_BY_OPERATOR]
    halting = signal.level is Level.HALT
    for halt in pressure:
        if halting and halt.reason == signal.reason:
            if (halt.value, halt.limit, halt.detail) != (signal.value, signal.limit,
                                                         signal.detail):
                Halt.objects.filter(pk=halt.pk).update(value=signal.value,
                                                       limit=signal.limit,
                                                       detail=signal.detail)
            continue
        Halt.objects.filter(pk=halt.pk).update(ended_at=now, ended_by="engine")
        log.info("policy released", policy=policy_name, reason=halt.reason,
                 halted_for=str(now - halt.began_at))
    if halting and signal.reason not in {halt.reason for halt in pressure}:
        Halt.objects.create(policy=policy_name, reason=signal.reason, value=signal.value,
                            limit=signal.limit, detail=signal.detail, actor="engine")
        log.warning("policy halted", policy=policy_name, reason=signal.reason,
                    detail=signal.detail)
    return halted


def weigh_failing(run_id) -> Halt | None:
    """After one of the run's chunks was dead-lettered, in the same transaction: halt
    the run's policy if more than half of the policy's last chunks were, whichever of
    its runs they belong to; return the halt opened (None: it goes on, or it was halted
    for failing already)."""
    # The run's policy, whether it is halted for failing now, and when it was last
    # resumed from that: one statement (a dead letter's transaction stays short).
    failing = Halt.objects.filter(policy=OuterRef("policy"), reason=Halt.FAILING)
    run = Run.objects.filter(pk=run_id).values("policy").annotate(
        halted=Exists(failing.filter(ended_at__isnull=True)),
        resumed=Subquery(failing.filter(ended_at__isnull=False).order_by("-ended_at")
                         .values("ended_at")[:1]),
    ).get()
    if run["halted"]:
        return None
    policy, resumed, weighed = run["policy"], run["resumed"], conf.FAILING_CHUNKS
    # A run has a chunk at least, so the policy's last chunks are among its last
    # ``weighed`` runs: the read stays bounded however long the policy has run.
    runs = Run.objects.filter(policy=policy).order_by("-created_at").values("pk")[:weighed]
    chunks = Chunk.objects.filter(run__in=runs, state__in=ENDED)
    last = list(chunks.alias(ended_at=Coalesce("dead_lettered_at", "committed_at"))
                .filter(**({"ended_at__gt": resumed} if resumed else {}))
                .order_by("-ended_at").values_list("state", "cause")[:weighed])
    causes = [cause for state, cause in last if state == Chunk.State.DEAD_LETTERED]
    if len(causes) * 2 <= weighed:
        return None
    cause, alike = Counter(causes).most_common(1)[0]
    detail = (f"{len(causes)} of the policy's last {len(last)} chunks were "
              f"dead-lettered, {alike} of them for: {cause or 'no cause recorded'}")
    halt = begin(policy, Halt.FAILING, detail=detail, cause=cause, value=len(causes),
                 limit=weighed / 2, actor="engine")
    if halt is None:
        return None  # a chunk of another of its runs halted it a moment ago
    failing_log.error("policy failing: halted until resumed", policy=policy, run_id=str(run_id),
                      dead_lettered=len(causes), weighed=len(last), cause=cause)
    return halt


def begin(policy_name: str, reason: str, *, detail: str, actor: str, cause: str = "",
          value: float | None = None, limit: float | None = None) -> Halt | None:
    """Open a halt of the policy for ``reason`` (a pause, a failing policy); None if one
    is open for that reason already (one open per policy and reason, which the database
    keeps), the caller's transaction then left as it was."""
    try:
        with transaction.atomic():
            return Halt.objects.create(policy=policy_name, reason=reason, detail=detail,
                                       cause=cause, value=value, limit=limit, actor=actor)
    except IntegrityError:
        return None


def end(policy_name: str, *, actor: str, reasons: tuple[str, ...] | None = None
        ) -> list[Halt]:
    """End the policy's open halts (those for ``reasons``; every one without), oldest
    first, in the caller's transaction; return them as ended."""
    halted = Halt.objects.select_for_update().order_by("began_at").filter(
        policy=policy_name, ended_at__isnull=True)
    ended = list(halted.filter(reason__in=reasons) if reasons is not None else halted)
    now = timezone.now()
    Halt.objects.filter(pk__in=[halt.pk for halt in ended]).update(ended_at=now,
                                                                   ended_by=actor)
    for halt in ended:
        halt.ended_at, halt.ended_by = now, actor
    return ended


def open_halts(policy_name: str) -> list[Halt]:
    """The policy's halts in force now, oldest first."""
    return list(Halt.objects.filter(policy=policy_name, ended_at__isnull=True)
                .order_by("began_at"))


def describe(halt: Halt, now: datetime | None = None) -> str:
    """A halt in words: "paused 2 min by alice: nightly maintenance"; "paused just now"
    in its first second (not "0.0 s")."""
    until = halt.ended_at or now or timezone.now()
    seconds = max(until - halt.began_at, timedelta(0)).total_seconds()
    took = duration(seconds) if seconds >= 1 else "just now"
    if halt.reason == Halt.PAUSED:
        who = f" by {halt.actor}" if halt.actor else ""
        return f"paused {took}{who}: {halt.detail}"
    if halt.reason == Halt.FAILING:
        return f"failing {took}, halted until resumed: {halt.detail}"
    return f"halted {took}: {halt.detail or halt.reason}"


def fields(halt: Halt) -> dict:
    """A halt, JSON-safe, as the pause and resume commands print it under --json."""
    return {"policy": halt.policy, "reason": halt.reason, "detail": halt.detail,
            "actor": halt.actor, "began_at": halt.began_at.isoformat(),
            "ended_at": halt.ended_at.isoformat() if halt.ended_at else None,
            "ended_by": halt.ended_by, "described": describe(halt)}
