"""Keep one django-q2 Schedule per scheduled policy, and none for the others."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import structlog
from django.db import transaction
from django.utils import timezone
from django_q.models import Schedule

from cleanup.conf import lease
from cleanup.dispatch import dispatch
from cleanup.models import Run
from cleanup.policies import all_policies

log = structlog.get_logger("cleanup.schedules")

DISPATCH_TASK = "cleanup.tasks.dispatch_scheduled"
NAME_PREFIX = "cleanup:"
# The engine's own minute-by-minute tasks, beside one schedule per policy.
ENGINE_SCHEDULES = {
    "reconcile": "cleanup.tasks.reconcile_chunks",
    "heartbeat": "cleanup.tasks.heartbeat",
}


@dataclass
class ScheduleChanges:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)


def install_schedules() -> ScheduleChanges:
    """Create, update or remove schedules so they match the registered policies.

    The slot django-q2 meant to fire is passed as ``scheduled_for``; it keys the run,
    so a slot fired twice gives one run.
    """
    changes = ScheduleChanges()
    wanted = {
        f"{NAME_PREFIX}{p.name}": {
            "func": DISPATCH_TASK,
            "kwargs": repr({"policy": p.name}),
            "cron": p.schedule,
            "intended_date_kwarg": "scheduled_for",
        }
        for p in all_policies()
        if p.schedule is not None
    }
    for name, func in ENGINE_SCHEDULES.items():
        wanted[f"{NAME_PREFIX}{name}"] = {
            "func": func, "kwargs": None, "cron": "* * * * *", "intended_date_kwarg": None,
        }
    with transaction.atomic():
        existing = {
            s.name: s for s in Schedule.objects.select_for_update().filter(
                name__startswith=NAME_PREFIX
            )
        }
        for name, spec in wanted.items():
            fields = {**spec, "schedule_type": Schedule.CRON, "repeats": -1}
            schedule = existing.get(name)
            if schedule is None:
                Schedule.objects.create(name=name, **fields)
                changes.created.append(name)
            elif any(getattr(schedule, k) != v for k, v in fields.items()):
                for k, v in fields.items():
                    setattr(schedule, k, v)
                schedule.next_run = schedule.calculate_next_run()
                schedule.save()
                changes.updated.append(name)
            else:
                changes.unchanged.append(name)
        for name in sorted(existing.keys() - wanted.keys()):
            existing[name].delete()
            changes.removed.append(name)
    return changes


def schedule_key(policy: str, slot: datetime) -> str:
    return f"schedule:{policy}:{slot.isoformat()}"


def dispatch_slot(policy: str, slot: datetime) -> Run | None:
    """Start the run of one schedule slot, keyed by the slot.

    Skipped while a run of the policy started within the lease is still running: it
    would plan the rows already in flight again. A run older than that is presumed
    stalled, and the slot dispatches anyway.
    """
    key = schedule_key(policy, slot)
    existing = Run.objects.filter(dispatch_key=key).first()
    if existing is not None:  # the slot fired twice
        return existing
    in_flight = (
        Run.objects.filter(policy=policy, state=Run.State.RUNNING,
                           created_at__gte=timezone.now() - lease())
        .order_by("-created_at")
        .first()
    )
    if in_flight is not None:
        log.info("schedule slot skipped", policy=policy, slot=slot.isoformat(),
                 in_flight_run=str(in_flight.id))
        return None
    return dispatch(policy, key=key, trigger=Run.Trigger.SCHEDULE).run
