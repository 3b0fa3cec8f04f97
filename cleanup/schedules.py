"""Keep one django-q2 Schedule per scheduled policy, and none for the others."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db import transaction
from django_q.models import Schedule

from cleanup.policies import all_policies

DISPATCH_TASK = "cleanup.tasks.dispatch_scheduled"
NAME_PREFIX = "cleanup:"


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
        f"{NAME_PREFIX}{p.name}": p for p in all_policies() if p.schedule is not None
    }
    with transaction.atomic():
        existing = {
            s.name: s for s in Schedule.objects.select_for_update().filter(
                name__startswith=NAME_PREFIX
            )
        }
        for name, policy in wanted.items():
            fields = {
                "func": DISPATCH_TASK,
                "kwargs": repr({"policy": policy.name}),
                "schedule_type": Schedule.CRON,
                "cron": policy.schedule,
                "intended_date_kwarg": "scheduled_for",
                "repeats": -1,
            }
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
