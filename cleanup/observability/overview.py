"""Per-policy health read from the ledger: backlog, stalled work, missed schedules.

One reading serves every door that shows it: the console's overview, ``cleanup_policies``
and /metrics each format what they need of ``overview()``, which reads all the policies
at once, so no two of them can say a different backlog of the same database. Each door
gives the budget its backlog is read within (cleanup.observability.backlog): the console's
second, a scrape's 40 ms.

"Missed schedule" (the scheduler did not fire a slot that is due) and "stalled work"
(chunks sent, or slots fired, and not finished within the redelivery window) are separate signals
with separate owners: the first points at the scheduler, the second at workers or the
database (see cleanup.scheduling.slots). Halts left open by a policy a deploy removed
are listed apart: no registered policy reads them.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from croniter import croniter
from django.db.models import Count, Min, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce, Substr
from django.utils import timezone
from django_q.models import Schedule

from cleanup import display
from cleanup.conf import conf
from cleanup.engine import halts
from cleanup.engine.transport import redelivery_window
from cleanup.models import BlockedStep, Chunk, Halt, Run, ScheduleInstall, Slot
from cleanup.observability.backlog import Backlog, Budget, backlogs
from cleanup.policies import Policy, all_policies
from cleanup.scheduling.schedules import NAME_PREFIX
from cleanup.scheduling.slots import lag_since


@dataclass(frozen=True)
class ScheduleStatus:
    installed: bool
    cron: str | None = None
    next_slot: datetime | None = None  # the next slot from now
    expected_slot: datetime | None = None  # the first slot the scheduler has not fired
    lag: timedelta = timedelta(0)
    missed: bool = False
    undispatched: int = 0  # slots fired but taken by no worker within the redelivery window
    period: timedelta | None = None


UNSCHEDULED_BACKLOG_LIMIT = timedelta(days=1)
# How long a statement of the overview's and cleanup_policies' backlog may take (a scrape
# has its own 40 ms): past it, the backlog is unknown.
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
    """One policy's health, as ``overview()`` read it."""

    policy: str
    backlog: Backlog | None  # as read within the budget; None: nothing measured
    backlog_since: datetime | None  # when the backlog's oldest row became eligible
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
    def eligible_rows(self) -> int | None:
        """The rows eligible now as the console shows them: None (unknown) unless the
        backlog was read exactly now; /metrics also exports an inexact reading."""
        return self.backlog.rows if self.backlog is not None and self.backlog.exact else None

    @property
    def eligible_at_least(self) -> bool:
        """Whether counting stopped at the engine's cap: there may be more rows."""
        return self.eligible_rows is not None and self.backlog.capped

    @property
    def oldest_eligible_since(self) -> datetime | None:
        return self.backlog_since if self.eligible_rows is not None else None

    @property
    def oldest_eligible_age(self) -> timedelta | None:
        return _age(self.now, self.oldest_eligible_since)

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
        if not self.schedule.installed and self.schedule.cron is not None:
            # Never "All clear" beside it: nothing dispatches the policy on its schedule.
            found.append(Alert(self.policy, "not-installed", "Schedule not installed",
                               "run manage.py cleanup_schedule: until then nothing "
                               "dispatches it on its schedule", level="warning"))
        if self.schedule.missed:
            found.append(Alert(self.policy, "missed-schedule", "Missed schedule",
                               f"the scheduler has not fired the slot due "
                               f"{display.ago(self.schedule.expected_slot, self.now)}"))
        if self.stalled:
            parts = []
            if self.stalled_chunks:
                parts.append(f"{self.stalled_chunks:,} of {self.unfinished_chunks:,} "
                             "unfinished chunks sent longer than the redelivery window ago")
            if self.schedule.undispatched:
                parts.append(f"{self.schedule.undispatched:,} fired slots no worker "
                             "dispatched")
            found.append(Alert(self.policy, "stalled", "Stalled work", "; ".join(parts)))
        if self.backlog_too_old:
            found.append(Alert(
                self.policy, "backlog", "Backlog too old",
                f"{'at least ' if self.eligible_at_least else ''}{self.eligible_rows:,} "
                "rows eligible, the oldest for "
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
    registered = {policy.name for policy in all_policies()}
    return [GonePolicy(name, tuple(halted), now) for name, halted in open_halts().items()
            if name not in registered]


def open_halts() -> dict[str, list[Halt]]:
    """Every halt in force, by policy (registered or not), oldest first: one query."""
    found: dict[str, list[Halt]] = {}
    for halt in Halt.objects.filter(ended_at__isnull=True).order_by("policy", "began_at"):
        found.setdefault(halt.policy, []).append(halt)
    return found


def banner(policies: list[PolicyOverview], clusters: list[dict],
           gone: Sequence[GonePolicy] = (), blocked: Sequence[BlockedStep] = ()
           ) -> list[Alert]:
    """Every alert the overview shows at its top: the clusters', the steps a lock
    blocks, each policy's, then the halts of policies no longer registered."""
    found = []
    if not any(cluster.get("taking_work") for cluster in clusters):
        found.append(Alert(None, "no-worker", "No worker cluster is taking work",
                           _no_worker(clusters)))
    found.extend(_blocked(step) for step in blocked)
    for policy in policies:
        found.extend(policy.alerts())
    found.extend(policy.alert() for policy in gone)
    return found


def _blocked(step: BlockedStep) -> Alert:
    held = f"held by {step.blocker}" if step.blocker_pid else step.blocker
    lock = f" ({step.blocker_lock})" if step.blocker_lock else ""
    return Alert(step.policy or None, "blocked", f"{str(step).capitalize()} blocked by a lock",
                 f"gave up {step.times:,} {'time' if step.times == 1 else 'times'} since "
                 f"{display.utc_text(step.since)} UTC on a lock {held}{lock}; it is tried "
                 "again at each turn")


def _no_worker(clusters: list[dict]) -> str:
    if not clusters:
        return "no cluster has ever beaten: start manage.py qcluster"
    stopped = [cluster["stopped_at"] for cluster in clusters if cluster.get("stopped_at")]
    if len(stopped) == len(clusters):
        which = "the cluster" if len(clusters) == 1 else "every cluster"
        last = display.utc_text(datetime.fromisoformat(max(stopped)))
        return (f"{which} stopped (the last at {last} UTC): start manage.py qcluster; "
                "nothing is dispatched or applied meanwhile")
    return "start manage.py qcluster: nothing is dispatched or applied"


def overview(now: datetime | None = None, budget: Budget | None = None
             ) -> list[PolicyOverview]:
    """Every registered policy's health at ``now``, its backlog read within ``budget``
    (default: ``BACKLOG_BUDGET_MS`` a statement).

    Read for all the policies at once: one statement each for the chunks in flight, the
    schedules, the last successes and the halts, and each policy's backlog through its
    own index. A backlog table locked by another session (a migration's ACCESS
    EXCLUSIVE lock) costs the budget, never a page or a scrape that hangs; past it the
    backlog is not exact, and the console says unknown, never 0.
    """
    now = now or timezone.now()
    policies = all_policies()
    chunks = chunks_in_flight(now)
    schedules = schedule_statuses(policies, now)
    backlog = backlogs(policies, now, budget or Budget(BACKLOG_BUDGET_MS))
    successes = last_successes()
    halted = open_halts()
    found = []
    for policy in policies:
        reading, flying = backlog[policy.name], chunks.get(policy.name, {})
        oldest = reading and reading.oldest_observed
        found.append(PolicyOverview(
            policy=policy.name,
            backlog=reading,
            backlog_since=policy.eligible_since(oldest) if oldest else None,
            unfinished_chunks=flying.get("unfinished", 0),
            oldest_unfinished_since=flying.get("oldest_unfinished"),
            stalled_chunks=flying.get("stalled", 0),
            awaiting_ack=flying.get("awaiting_ack", 0),
            dead_letters=flying.get("dead", 0),
            last_success=successes.get(policy.name),
            schedule=schedules[policy.name],
            now=now,
            halted=tuple(halts.describe(halt, now) for halt in halted.get(policy.name, ())),
        ))
    return found


def chunks_in_flight(now: datetime) -> dict[str, dict]:
    """Per policy: the unfinished chunks (the oldest, the stalled ones), those awaiting
    their acknowledgement and the dead letters, read through the state index (the
    chunks in these states, not the ledger)."""
    unfinished = Q(state__in=Chunk.UNFINISHED)
    rows = (
        Chunk.objects.filter(state__in=(*Chunk.UNFINISHED, Chunk.State.COMMITTED,
                                        Chunk.State.DEAD_LETTERED))
        # Stalled: unfinished for longer than the redelivery window since it was (re)sent, however
        # many deliveries started meanwhile (one stuck on row locks keeps starting).
        .alias(sent_at=Coalesce("enqueued_at", "planned_at"))
        .values("run__policy")
        .annotate(
            unfinished=Count("pk", filter=unfinished),
            oldest_unfinished=Min("planned_at", filter=unfinished),
            stalled=Count("pk", filter=unfinished & Q(sent_at__lt=now - redelivery_window())),
            awaiting_ack=Count("pk", filter=Q(state=Chunk.State.COMMITTED)),
            dead=Count("pk", filter=Q(state=Chunk.State.DEAD_LETTERED)),
        )
        .order_by()
    )
    return {row.pop("run__policy"): row for row in rows}


def last_successes() -> dict[str, Run]:
    """Each policy's last run that completed without dead letters: one query."""
    runs = (Run.objects.filter(state=Run.State.COMPLETED, finished_at__isnull=False)
            .order_by("policy", "-finished_at").distinct("policy"))
    return {run.policy: run for run in runs}


def schedule_statuses(policies: list[Policy], now: datetime) -> dict[str, ScheduleStatus]:
    """Whether the scheduler fires each policy's slots, from the slot ledger: one
    statement for them all (four per policy were 28 of a scrape's 52 statements)."""
    names = [f"{NAME_PREFIX}{p.name}" for p in policies if p.schedule is not None]
    policy = Substr(OuterRef("name"), len(NAME_PREFIX) + 1)
    slots = Slot.objects.filter(policy=policy).order_by()
    rows = Schedule.objects.filter(name__in=names).annotate(
        installed_at=Subquery(ScheduleInstall.objects.filter(policy=policy)
                              .values("installed_at")[:1]),
        last_fired=Subquery(slots.order_by("-fired_at").values("fired_at")[:1]),
        undispatched=Subquery(
            slots.filter(outcome=Slot.Outcome.FIRED, fired_at__lt=now - redelivery_window())
            .values("policy").annotate(n=Count("pk")).values("n")),
    ).values_list("name", "cron", "installed_at", "last_fired", "undispatched")
    found = {name: (cron, installed, fired, waiting) for name, cron, installed, fired, waiting
             in rows}
    statuses = {}
    for each in policies:
        name = f"{NAME_PREFIX}{each.name}"
        if each.schedule is None:
            statuses[each.name] = ScheduleStatus(installed=False)
        elif name not in found:
            statuses[each.name] = ScheduleStatus(installed=False, cron=each.schedule)
        else:
            cron, installed, fired, waiting = found[name]
            lag = lag_since([installed, fired], cron, now)
            # One iterator for the next two slots: parsing the cron again was a third
            # of this function's CPU.
            slots = croniter(cron, now)
            next_slot = slots.get_next(datetime)
            statuses[each.name] = ScheduleStatus(
                installed=True,
                cron=cron,
                next_slot=next_slot,
                expected_slot=lag.expected_slot,
                lag=lag.lag,
                missed=lag.lag > timedelta(seconds=conf.SCHEDULE_GRACE_SECONDS),
                undispatched=waiting or 0,
                period=slots.get_next(datetime) - next_slot,
            )
    return statuses


def backlog_age_limit(schedule: ScheduleStatus) -> timedelta | None:
    """How old the oldest eligible row may get before the backlog is too old.

    Two schedule periods (a row that became eligible just after a run waits one period
    for the next, and that run may take a while) plus the redelivery window (how long a chunk may
    take before it counts as stalled).
    """
    return 2 * schedule.period + redelivery_window() if schedule.period else None


def _age(now: datetime, since: datetime | None) -> timedelta | None:
    return max(now - since, timedelta(0)) if since else None
