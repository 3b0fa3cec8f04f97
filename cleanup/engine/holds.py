"""Holds: a policy that plans and sends nothing new until it is resumed.

An operator pauses a policy (``cleanup_pause``); while the pause is open, topping up the
window plans nothing for the policy's runs (cleanup.engine.window), a dispatch creates
its run and says it is held, and scheduled slots still coalesce into the run in flight.
Chunks already sent finish; nothing is dead-lettered, retried or failed for being held,
and the runs stay running. Resuming ends the hold and refills the window at once.

Every hold is kept, ended or not, with its reason and who began and ended it: the
ledger of why a policy was not working.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import structlog
from django.db import IntegrityError, transaction
from django.utils import timezone

from cleanup.display import duration
from cleanup.engine import window
from cleanup.exceptions import CleanupError
from cleanup.models import Hold
from cleanup.policies import get_policy

log = structlog.get_logger("cleanup.holds")


@dataclass(frozen=True)
class HoldChange:
    hold: Hold
    changed: bool  # False: it was already so (a second pause, a second resume)
    planned: int = 0  # chunks planned at once on resuming


def pause(policy_name: str, reason: str, *, actor: str = "") -> HoldChange:
    """Open a pause of the policy; a policy already paused keeps its first pause."""
    policy = get_policy(policy_name)
    reason = (reason or "").strip()
    if not reason:
        raise CleanupError("a pause needs a reason (--reason): it is what the console, "
                           "the status and the alerts show")
    try:
        with transaction.atomic():
            hold = Hold.objects.create(policy=policy.name, reason=Hold.PAUSED, detail=reason,
                                       actor=actor)
    except IntegrityError:  # paused already (the one open pause per policy)
        return HoldChange(open_holds(policy.name)[0], changed=False)
    log.warning("policy paused", policy=policy.name, reason=reason, actor=actor)
    return HoldChange(hold, changed=True)


def resume(policy_name: str, *, actor: str = "") -> HoldChange:
    """End the policy's pause and top its window up now; a policy not paused is left
    as it is (``changed`` False, with its last pause if it had one)."""
    policy = get_policy(policy_name)
    with transaction.atomic():
        hold = (Hold.objects.select_for_update()
                .filter(policy=policy.name, reason=Hold.PAUSED, ended_at__isnull=True).first())
        if hold is None:
            last = Hold.objects.filter(policy=policy.name, reason=Hold.PAUSED).first()
            if last is None:
                raise CleanupError(f"policy {policy.name!r} is not paused")
            return HoldChange(last, changed=False)
        hold.ended_at, hold.ended_by = timezone.now(), actor
        hold.save(update_fields=["ended_at", "ended_by"])
    # Its own transaction, after the hold ended: the window refills as a chunk's end would.
    planned = window.top_up_now(policy.name)
    log.info("policy resumed", policy=policy.name, actor=actor, planned=planned,
             held_for=str(hold.ended_at - hold.began_at))
    return HoldChange(hold, changed=True, planned=planned)


def open_holds(policy_name: str) -> list[Hold]:
    """The policy's holds in force now, oldest first."""
    return list(Hold.objects.filter(policy=policy_name, ended_at__isnull=True)
                .order_by("began_at"))


def held_policies() -> dict[str, list[Hold]]:
    """Every policy held now, with its open holds."""
    held: dict[str, list[Hold]] = {}
    for hold in Hold.objects.filter(ended_at__isnull=True).order_by("began_at"):
        held.setdefault(hold.policy, []).append(hold)
    return held


def describe(hold: Hold, now: datetime | None = None) -> str:
    """A hold in words: "paused 2 min 10 s by alice: nightly maintenance"."""
    until = hold.ended_at or now or timezone.now()
    took = duration(max(until - hold.began_at, timedelta(0)).total_seconds())
    if hold.reason == Hold.PAUSED:
        who = f" by {hold.actor}" if hold.actor else ""
        return f"paused {took}{who}: {hold.detail}"
    return f"held {took}: {hold.detail or hold.reason}"
