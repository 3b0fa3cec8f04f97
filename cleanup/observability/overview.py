"""Per-policy health read from the ledger: backlog, stalled work, missed schedules.

"Missed schedule" (the scheduler did not fire a slot that is due) and "stalled work"
(chunks sent, or slots fired, and not finished within the lease) are separate signals
with separate owners: the first points at the scheduler, the second at workers or the
database (see cleanup.scheduling.triggers). Halts left open by a policy a deploy removed
are listed apart: no registered policy reads them.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from croniter import croniter
from django.db.models import Count, Min, Q
from django.db.models.functions import Coalesce
from django.utils import timezone
from django_q.models import Schedule

from cleanup import display
from cleanup.conf import conf
from cleanup.engine import halts
from cleanup.engine.transport import lease
from cleanup.expressions import Clamped
from cleanup.models import Chunk, Halt, Run
from cleanup.observability.backlog import Budget
from cleanup.policies import Policy, all_policies
from cleanup.scheduling import triggers
from cleanup.scheduling.schedules import NAME_PREFIX


@dataclass(frozen=True)
class ScheduleStatus:
    installed: bool
    cron: str | None = None
    next_slot: datetime | None = None  # the next slot from now
    expected_slot: datetime | None = None  # the first slot the scheduler has not fired
    lag: timedelta = timedelta(0)
    missed: bool = False
    undispatched: int = 0  # slots fired but taken by no worker within the lease
    period: timedelta | None = None


UNSCHEDULED_BACKLOG_LIMIT = timedelta(days=1)
# How long the overview, cleanup_policies and /health may take to read one policy's
# backlog (an exact count): past it, the backlog is unknown.
BACKLOG_BUDGET_MS = 1000


@dataclass(frozen=True)
class Alert:
    """One thing the overview's banner says, as the alert rules would page for it."""

    policy: str | None
    kind: str
    title: str
    detail: str
    level: str = "critical"


@dataclass(frozen=True)
class PolicyOverview:
    policy: str
    eligible_rows: int | None  # None: not read within BACKLOG_BUDGET_MS (unknown)
    oldest_eligible_since: datetime | None
    unfinished_chunks: int
    oldest_unfinished_since: datetime | None
    stalled_chunks: int
    awaiting_ack: int
    dead_letters: int
    last_success: Run | None
    schedule: ScheduleStatus
    now: datetime
    # The policy's halts in force, in words (cleanup.engine.halts): a pause.
    halted: tuple[str, ...] = ()

    @property
    def oldest_eligible_age(self) -> timedelta | None:
        return _age(self.now, self.oldest_eligible_since)

    @property
    def oldest_unfinished_age(self) -> timedelta | None:
        return _age(self.now, self.oldest_unfinished_since)

    @property
    def stalled(self) -> bool:
        """Work that was handed over and is not getting done: chunks, or fired slots."""
        return self.stalled_chunks > 0 or self.schedule.undispatched > 0

    @property
    def backlog_age_limit(self) -> timedelta:
        """How old the oldest eligible row may get (CleanupBacklogTooOld's limit); a day
        for a policy no schedule runs."""
        return backlog_age_limit(self.schedule) or UNSCHEDULED_BACKLOG_LIMIT

    @property
    def backlog_too_old(self) -> bool:
        age = self.oldest_eligible_age
        return age is not None and age > self.backlog_age_limit

    def alerts(self) -> list[Alert]:
        """What the shipped alert rules would say about this policy now."""
        found = []
        if self.schedule.missed:
            found.append(Alert(self.policy, "missed-schedule", "Missed schedule",
                               f"the scheduler has not fired the slot due "
                               f"{display.ago(self.schedule.expected_slot, self.now)}"))
        if self.stalled:
            parts = []
            if self.stalled_chunks:
                parts.append(f"{self.stalled_chunks:,} of {self.unfinished_chunks:,} "
                             "unfinished chunks sent longer than the lease ago")
            if self.schedule.undispatched:
                parts.append(f"{self.schedule.undispatched:,} fired slots no worker "
                             "dispatched")
            found.append(Alert(self.policy, "stalled", "Stalled work", "; ".join(parts)))
        if self.backlog_too_old:
            found.append(Alert(
                self.policy, "backlog", "Backlog too old",
                f"{self.eligible_rows:,} rows eligible, the oldest for "
                f"{display.duration(self.oldest_eligible_age.total_seconds())} (limit "
                f"{display.duration(self.backlog_age_limit.total_seconds())})"))
        if self.eligible_rows is None:
            found.append(Alert(
                self.policy, "backlog-unknown", "Backlog unknown",
                f"its eligible rows could not be counted within {BACKLOG_BUDGET_MS:,} ms: "
                "its table may be locked by another session", level="warning"))
        for halt in self.halted:
            found.append(Alert(self.policy, "halted", "Halted", f"{halt}; nothing new is "
                               "planned until it is resumed", level="warning"))
        if self.dead_letters:
            found.append(Alert(self.policy, "dead-letters", "Dead letters waiting",
                               f"{self.dead_letters:,} "
                               f"{'chunk needs' if self.dead_letters == 1 else 'chunks need'}"
                               " a person: requeue "
                               "after a fix, or discard with a reason", level="warning"))
        return found


@dataclass(frozen=True)
class GonePolicy:
    """A policy a deploy removed while it was halted: its halts stay open, and its
    ``cleanup_policy_held`` at 1, until an operator resumes it by name."""

    policy: str
    open_halts: tuple[Halt, ...]  # oldest first
    now: datetime

    @property
    def halted(self) -> tuple[str, ...]:
        return tuple(halts.describe(halt, self.now) for halt in self.open_halts)

    @property
    def resume_command(self) -> str:
        return f"manage.py cleanup_resume --policy {shlex.quote(self.policy)}"

    def alert(self) -> Alert:
        return Alert(self.policy, "halted-gone", "Halted, and no longer registered",
                     f"{'; '.join(self.halted)}; the policy was removed by a deploy: end "
                     f"it with {self.resume_command}", level="warning")

    def fields(self) -> dict:
        """JSON-safe, as ``gone_policy_halts`` in the commands' --json."""
        return {"policy": self.policy, "halts": [halts.fields(halt) for halt in self.open_halts],
                "resume_command": self.resume_command}


def gone_policies(now: datetime | None = None) -> list[GonePolicy]:
    """The policies no longer registered that still have halts open, by name, read in
    one query whatever their number."""
    now = now or timezone.now()
    found: dict[str, list[Halt]] = {}
    for halt in (Halt.objects.filter(ended_at__isnull=True)
                 .exclude(policy__in=[policy.name for policy in all_policies()])
                 .order_by("policy", "began_at")):
        found.setdefault(halt.policy, []).append(halt)
    return [GonePolicy(name, tuple(halted), now) for name, halted in found.items()]


def banner(policies: list[PolicyOverview], clusters: list[dict],
           gone: Sequence[GonePolicy] = ()) -> list[Alert]:
    """Every alert the overview shows at its top: the clusters', each policy's, then
    the halts of policies no longer registered."""
    found = []
    if not any(cluster.get("taking_work") for cluster in clusters):
        found.append(Alert(None, "no-worker", "No worker cluster is taking work",
                           "start manage.py qcluster: nothing is dispatched or applied"
                           if clusters else "no cluster has ever beaten: start "
                           "manage.py qcluster"))
    for policy in policies:
        found.extend(policy.alerts())
    found.extend(policy.alert() for policy in gone)
    return found


def overview(now: datetime | None = None) -> list[PolicyOverview]:
    now = now or timezone.now()
    return [policy_overview(p, now) for p in all_policies()]


def policy_overview(policy: Policy, now: datetime, *, exact: bool = True) -> PolicyOverview:
    """One policy's health; ``exact=False`` estimates the backlog's size from the planner.

    The backlog is read within ``BACKLOG_BUDGET_MS``: a learners' table locked by
    another session (a migration's ACCESS EXCLUSIVE lock) would otherwise hang the
    overview, the page an operator opens to see why work waits. Past the budget the
    backlog is unknown (None), never 0.
    """
    rows = policy.eligible_rows(policy.freeze(now))
    if exact:
        eligible = Budget(BACKLOG_BUDGET_MS).read(lambda: rows.aggregate(
            rows=Count("pk"), oldest=Min(Clamped(policy.observed_field))))
    else:
        eligible = Budget(BACKLOG_BUDGET_MS).read(lambda: rows.aggregate(
            oldest=Min(Clamped(policy.observed_field))))
        if eligible is not None:
            eligible["rows"] = planner_estimate(rows) if eligible["oldest"] else 0
    eligible = eligible or {"rows": None, "oldest": None}
    unfinished = Q(state__in=Chunk.UNFINISHED)
    chunks = (
        Chunk.objects.filter(run__policy=policy.name)
        # Stalled: unfinished for longer than the lease since it was (re)sent, however
        # many deliveries started meanwhile (one stuck on row locks keeps starting).
        .alias(sent_at=Coalesce("enqueued_at", "planned_at"))
        .aggregate(
            unfinished=Count("pk", filter=unfinished),
            oldest_unfinished=Min("planned_at", filter=unfinished),
            stalled=Count("pk", filter=unfinished & Q(sent_at__lt=now - lease())),
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
        halted=tuple(halts.describe(halt, now) for halt in halts.open_halts(policy.name)),
    )


def schedule_status(policy: Policy, now: datetime) -> ScheduleStatus:
    """Whether the scheduler fires the policy's slots, from the trigger ledger."""
    if policy.schedule is None:
        return ScheduleStatus(installed=False)
    schedule = Schedule.objects.filter(name=f"{NAME_PREFIX}{policy.name}").first()
    if schedule is None:
        return ScheduleStatus(installed=False, cron=policy.schedule)
    lag = triggers.schedule_lag(policy.name, schedule.cron, now)
    return ScheduleStatus(
        installed=True,
        cron=schedule.cron,
        next_slot=croniter(schedule.cron, now).get_next(datetime),
        expected_slot=lag.expected_slot,
        lag=lag.lag,
        missed=lag.lag > timedelta(seconds=conf.SCHEDULE_GRACE_SECONDS),
        undispatched=triggers.undispatched(policy.name, now),
        period=triggers.period(schedule.cron, now),
    )


def backlog_age_limit(schedule: ScheduleStatus) -> timedelta | None:
    """How old the oldest eligible row may get before the backlog is too old.

    Two schedule periods (a row that became eligible just after a run waits one period
    for the next, and that run may take a while) plus the lease (how long a chunk may
    take before it counts as stalled).
    """
    return 2 * schedule.period + lease() if schedule.period else None


def planner_estimate(queryset) -> int:
    """Rows PostgreSQL expects the queryset to return, from EXPLAIN: no rows are read."""
    plan = json.loads(queryset.explain(format="json"))
    return int(plan[0]["Plan"]["Plan Rows"])


def _age(now: datetime, since: datetime | None) -> timedelta | None:
    return max(now - since, timedelta(0)) if since else None
