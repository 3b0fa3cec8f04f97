"""Halts: times a policy plans and sends nothing new.

An operator pauses a policy (``cleanup_pause``, cleanup.engine.operations), the
database's pressure halts it (cleanup.engine.pressure: a standby replaying too far
behind, a failing indicator), or its chunks mostly fail (cleanup.engine.failing).
While a halt is open, topping up the window plans nothing for the policy's runs
(cleanup.engine.window), a dispatch creates its run and says it is halted, and
scheduled slots still coalesce into the run in flight. Chunks already sent finish;
nothing is dead-lettered, retried or failed for being halted, and the runs stay running.
A pause and a failing halt end when the policy is resumed; a pressure halt when its
signal clears, the window then refilling by itself.

Every halt is kept, ended or not, with its reason, its figures and who began and ended
it: the ledger of why a policy was not working. This module is its one writer: the
pressure's halts here, the failing policy's (cleanup.engine.failing) and the operator's
pause and resume (cleanup.engine.operations) through ``begin`` and ``end``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import structlog
from django.db import IntegrityError, transaction
from django.utils import timezone

from cleanup.display import duration
from cleanup.engine.pressure import Level, Signal
from cleanup.models import Halt

log = structlog.get_logger("cleanup.halts")


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
    """A halt in words: "paused 2 min 10 s by alice: nightly maintenance"."""
    until = halt.ended_at or now or timezone.now()
    took = duration(max(until - halt.began_at, timedelta(0)).total_seconds())
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
