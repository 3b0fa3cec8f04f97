"""Per-policy health read from the ledger: backlog, stalled work, missed schedules.

"Missed schedule" (no run for a slot that is due) and "stalled work" (chunks sent but
not finished within the lease) are separate signals with separate owners: the first
points at the scheduler, the second at workers or the database.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta

from croniter import croniter
from django.db.models import Count, Min, Q
from django.db.models.functions import Coalesce
from django.utils import timezone
from django_q.models import Schedule

from cleanup.conf import conf, lease
from cleanup.expressions import Clamped
from cleanup.models import Chunk, Run
from cleanup.policies import Policy, all_policies
from cleanup.schedules import NAME_PREFIX, schedule_key


@dataclass(frozen=True)
class ScheduleStatus:
    installed: bool
    cron: str | None = None
    next_run: datetime | None = None
    due_slot: datetime | None = None
    lag: timedelta = timedelta(0)
    missed: bool = False


@dataclass(frozen=True)
class PolicyOverview:
    policy: str
    eligible_rows: int
    oldest_eligible_since: datetime | None
    unfinished_chunks: int
    oldest_unfinished_since: datetime | None
    stalled_chunks: int
    awaiting_ack: int
    dead_letters: int
    last_success: Run | None
    schedule: ScheduleStatus
    now: datetime

    @property
    def oldest_eligible_age(self) -> timedelta | None:
        return _age(self.now, self.oldest_eligible_since)

    @property
    def oldest_unfinished_age(self) -> timedelta | None:
        return _age(self.now, self.oldest_unfinished_since)

    @property
    def stalled(self) -> bool:
        return self.stalled_chunks > 0


def overview(now: datetime | None = None) -> list[PolicyOverview]:
    now = now or timezone.now()
    return [policy_overview(p, now) for p in all_policies()]


def policy_overview(policy: Policy, now: datetime, *, exact: bool = True) -> PolicyOverview:
    """One policy's health; ``exact=False`` estimates the backlog's size from the planner."""
    rows = policy.eligible_rows(policy.freeze(now))
    if exact:
        eligible = rows.aggregate(rows=Count("pk"), oldest=Min(Clamped(policy.observed_field)))
    else:
        eligible = rows.aggregate(oldest=Min(Clamped(policy.observed_field)))
        eligible["rows"] = planner_estimate(rows) if eligible["oldest"] else 0
    unfinished = Q(state__in=Chunk.UNFINISHED)
    chunks = (
        Chunk.objects.filter(run__policy=policy.name)
        .alias(last_seen=Coalesce("last_delivery_at", "enqueued_at", "planned_at"))
        .aggregate(
            unfinished=Count("pk", filter=unfinished),
            oldest_unfinished=Min("planned_at", filter=unfinished),
            stalled=Count("pk", filter=unfinished & Q(last_seen__lt=now - lease())),
            awaiting_ack=Count("pk", filter=Q(state=Chunk.State.COMMITTED)),
            dead=Count("pk", filter=Q(state=Chunk.State.DEAD_LETTERED)),
        )
    )
    last_success = (
        Run.objects.filter(policy=policy.name, state=Run.State.COMPLETED)
        .order_by("-finished_at")
        .first()
    )
    oldest = eligible["oldest"]
    return PolicyOverview(
        policy=policy.name,
        eligible_rows=eligible["rows"],
        oldest_eligible_since=policy.eligible_since(oldest) if oldest else None,
        unfinished_chunks=chunks["unfinished"],
        oldest_unfinished_since=chunks["oldest_unfinished"],
        stalled_chunks=chunks["stalled"],
        awaiting_ack=chunks["awaiting_ack"],
        dead_letters=chunks["dead"],
        last_success=last_success,
        schedule=schedule_status(policy, now),
        now=now,
    )


def schedule_status(policy: Policy, now: datetime) -> ScheduleStatus:
    """Whether the newest slot that is due has its run."""
    if policy.schedule is None:
        return ScheduleStatus(installed=False)
    schedule = Schedule.objects.filter(name=f"{NAME_PREFIX}{policy.name}").first()
    if schedule is None:
        return ScheduleStatus(installed=False, cron=policy.schedule)
    due_slot = croniter(schedule.cron, now).get_prev(datetime)
    # A slot is served by its own run, or skipped because a run was in flight then.
    served = Run.objects.filter(
        Q(dispatch_key=schedule_key(policy.name, due_slot))
        | Q(policy=policy.name, created_at__lte=due_slot)
        & (Q(finished_at__isnull=True) | Q(finished_at__gte=due_slot))
    ).exists()
    lag = timedelta(0) if served else now - due_slot
    return ScheduleStatus(
        installed=True,
        cron=schedule.cron,
        next_run=schedule.next_run,
        due_slot=due_slot,
        lag=lag,
        missed=lag > timedelta(seconds=conf.SCHEDULE_GRACE_SECONDS),
    )


def planner_estimate(queryset) -> int:
    """Rows PostgreSQL expects the queryset to return, from EXPLAIN: no rows are read."""
    plan = json.loads(queryset.explain(format="json"))
    return int(plan[0]["Plan"]["Plan Rows"])


def _age(now: datetime, since: datetime | None) -> timedelta | None:
    return max(now - since, timedelta(0)) if since else None
