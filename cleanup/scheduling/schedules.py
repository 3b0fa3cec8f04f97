"""Keep one django-q2 Schedule per scheduled policy, and none for the others."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import structlog
from croniter import croniter
from django.db import transaction
from django_q.models import Schedule

from cleanup.engine.dispatch import dispatch
from cleanup.engine.transport import redelivery_window
from cleanup.exceptions import UnknownTask
from cleanup.models import Run, Slot
from cleanup.policies import all_policies
from cleanup.scheduling import slots

log = structlog.get_logger("cleanup.schedules")

DISPATCH_TASK = "cleanup.tasks.dispatch_scheduled"
NAME_PREFIX = "cleanup:"
# The engine's own minute-by-minute tasks, beside one schedule per policy.
ENGINE_SCHEDULES = {
    "reconcile": "cleanup.tasks.reconcile_chunks",
    "heartbeat": "cleanup.tasks.heartbeat",
    "publish-events": "cleanup.tasks.publish_events",
}
# The host project's own periodic tasks, kept the same way (register_task).
_tasks: dict[str, tuple[str, str]] = {}


# What a host's schedule runs: the task, by name, as a step whose statements wait for a
# lock at most their bound (cleanup.tasks.run_task).
HOST_TASK = "cleanup.tasks.run_task"


def register_task(name: str, func: str, cron: str) -> None:
    """Keep a schedule ``cleanup:<name>`` that runs ``func`` (a task's dotted path) on
    ``cron``, installed, updated and removed by ``cleanup_schedule`` with the others.
    It runs as the step ``name``: every statement bounded, a lock held past the bound
    recorded with its holder (cleanup.engine.steps)."""
    if not croniter.is_valid(cron):
        raise ValueError(f"task {name!r}: {cron!r} is not a cron expression")
    _tasks[name] = (func, cron)


def registered_task(name: str) -> str:
    """The dotted path of the host's task ``name``."""
    try:
        return _tasks[name][0]
    except KeyError:
        raise UnknownTask(name, sorted(_tasks)) from None


@dataclass
class ScheduleChanges:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)


def wanted_schedules() -> dict[str, dict]:
    """Every schedule ``cleanup_schedule`` keeps, by name: one per policy with a
    schedule, the engine's own tasks and the host's (``register_task``)."""
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
    for name, (_func, cron) in _tasks.items():
        wanted[f"{NAME_PREFIX}{name}"] = {
            "func": HOST_TASK, "kwargs": repr({"name": name}), "cron": cron,
            "intended_date_kwarg": None,
        }
    for name, func in ENGINE_SCHEDULES.items():
        wanted[f"{NAME_PREFIX}{name}"] = {
            "func": func, "kwargs": None, "cron": "* * * * *", "intended_date_kwarg": None,
        }
    return wanted


def install_schedules() -> ScheduleChanges:
    """Create, update or remove schedules so they match the registered policies.

    The slot django-q2 meant to fire is passed as ``scheduled_for``; it keys the run,
    so a slot fired twice gives one run.
    """
    changes = ScheduleChanges()
    wanted = wanted_schedules()
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
                continue
            if spec["func"] == DISPATCH_TASK:
                slots.record_install(name.removeprefix(NAME_PREFIX), spec["cron"])
        for name in sorted(existing.keys() - wanted.keys()):
            existing[name].delete()
            changes.removed.append(name)
    return changes


def schedule_key(policy_name: str, slot: datetime) -> str:
    return f"schedule:{policy_name}:{slot.isoformat()}"


def dispatch_slot(policy_name: str, slot: datetime) -> Run:
    """Start the run of one fired schedule slot, keyed by the slot, or join one in flight.

    A run of the policy started within the redelivery window and still running takes
    the slot (coalesced, recorded on the slot): a new run would plan the rows already in
    flight again. That check holds the policy's planning lock, so slot tasks queued during a
    stall and run at once by several workers make one run, not a burst. A run older
    than the redelivery window is presumed stalled, and the slot starts a run anyway.
    """
    fired = slots.record_fire(policy_name, slot)  # the scheduler normally did already
    if fired.outcome != Slot.Outcome.FIRED:  # the slot was delivered twice
        return fired.run
    result = dispatch(policy_name, key=schedule_key(policy_name, slot),
                      trigger=Run.Trigger.SCHEDULE, coalesce_within=redelivery_window())
    slots.record_dispatch(fired, result.run, coalesced=result.coalesced)
    if result.coalesced:
        log.info("schedule slot coalesced", policy=policy_name, slot=slot.isoformat(),
                 in_flight_run=str(result.run.id))
    return result.run
