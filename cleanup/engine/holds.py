"""Holds: times a policy plans and sends nothing new.

An operator pauses a policy (``cleanup_pause``, cleanup.engine.operations), the
database's pressure holds it (cleanup.engine.pressure: a standby replaying too far
behind, a failing indicator), or its chunks mostly fail (cleanup.engine.failing).
While a hold is open, topping up the window plans nothing for the policy's runs
(cleanup.engine.window), a dispatch creates its run and says it is held, and
scheduled slots still coalesce into the run in flight. Chunks already sent finish;
nothing is dead-lettered, retried or failed for being held, and the runs stay running.
A pause and a failing hold end when the policy is resumed; a pressure hold when its
signal clears, the window then refilling by itself.

Every hold is kept, ended or not, with its reason, its figures and who began and ended
it: the ledger of why a policy was not working.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import structlog
from django.utils import timezone

from cleanup.display import duration
from cleanup.engine.pressure import Level, Signal
from cleanup.models import Hold

log = structlog.get_logger("cleanup.holds")


@dataclass(frozen=True)
class HoldChange:
    hold: Hold
    changed: bool  # False: it was already so (a second pause, a second resume)
    planned: int = 0  # chunks planned at once on resuming


def record_pressure(policy_name: str, signal: Signal, held: list[Hold]) -> None:
    """Keep the ledger in line with the policy's pressure signal, in the caller's
    transaction (under the policy's planning lock): a hold opens when a signal holds,
    its figures follow the latest reading, and it ends once the signal clears or names
    another reason. ``held`` is the policy's open holds, as read by the caller."""
    now = timezone.now()
    pressure = [hold for hold in held if hold.reason not in Hold.ENDED_BY_OPERATOR]
    holding = signal.level is Level.HOLD
    for hold in pressure:
        if holding and hold.reason == signal.reason:
            if (hold.value, hold.limit, hold.detail) != (signal.value, signal.limit,
                                                         signal.detail):
                Hold.objects.filter(pk=hold.pk).update(value=signal.value,
                                                       limit=signal.limit,
                                                       detail=signal.detail)
            continue
        Hold.objects.filter(pk=hold.pk).update(ended_at=now, ended_by="engine")
        log.info("policy released", policy=policy_name, reason=hold.reason,
                 held_for=str(now - hold.began_at))
    if holding and signal.reason not in {hold.reason for hold in pressure}:
        Hold.objects.create(policy=policy_name, reason=signal.reason, value=signal.value,
                            limit=signal.limit, detail=signal.detail, actor="engine")
        log.warning("policy held", policy=policy_name, reason=signal.reason,
                    detail=signal.detail)


def open_holds(policy_name: str) -> list[Hold]:
    """The policy's holds in force now, oldest first."""
    return list(Hold.objects.filter(policy=policy_name, ended_at__isnull=True)
                .order_by("began_at"))


def describe(hold: Hold, now: datetime | None = None) -> str:
    """A hold in words: "paused 2 min 10 s by alice: nightly maintenance"."""
    until = hold.ended_at or now or timezone.now()
    took = duration(max(until - hold.began_at, timedelta(0)).total_seconds())
    if hold.reason == Hold.PAUSED:
        who = f" by {hold.actor}" if hold.actor else ""
        return f"paused {took}{who}: {hold.detail}"
    if hold.reason == Hold.FAILING:
        return f"failing {took}, held until resumed: {hold.detail}"
    return f"held {took}: {hold.detail or hold.reason}"


def fields(hold: Hold) -> dict:
    """A hold, JSON-safe, as the pause and resume commands print it under --json."""
    return {"policy": hold.policy, "reason": hold.reason, "detail": hold.detail,
            "actor": hold.actor, "began_at": hold.began_at.isoformat(),
            "ended_at": hold.ended_at.isoformat() if hold.ended_at else None,
            "ended_by": hold.ended_by, "described": describe(hold)}
