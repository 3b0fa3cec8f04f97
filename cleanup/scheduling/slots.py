"""The slot ledger: which schedule slots fired, and what each one did.

"The scheduler fired" and "a run did the work" are separate facts, with separate
owners. A slot is recorded when the scheduler enqueues its dispatch task, in the
scheduler's own transaction; the dispatch task then records the run it started, or
the run in flight it was coalesced into. So:

- a **missed schedule** is measured from the scheduler's own firings alone: the lag is
  how long ago the first slot after its last firing (or after the schedule was
  installed) fell due. A run in flight does not hide it, and an outage of the workers
  does not cause it;
- a slot that fired but that no worker dispatched within the redelivery window counts as
  **stalled work**, like a chunk that was sent and did not finish: the queue is where
  it waits, and the workers are who must take it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from croniter import croniter
from django.utils import timezone

from cleanup.models import Run, ScheduleInstall, Slot


@dataclass(frozen=True)
class Lag:
    expected_slot: datetime | None  # the first slot the scheduler has not fired
    lag: timedelta  # how long ago it fell due (0 if not yet)


def record_fire(policy_name: str, slot_at: datetime) -> Slot:
    """Record that the scheduler fired ``slot_at``; firing it again changes nothing."""
    slot, _ = Slot.objects.get_or_create(policy=policy_name, slot_at=slot_at)
    return slot


def record_dispatch(slot: Slot, run: Run, *, coalesced: bool) -> None:
    """Record what a fired slot did: the run it started, or the one it joined."""
    Slot.objects.filter(pk=slot.pk, outcome=Slot.Outcome.FIRED).update(
        outcome=Slot.Outcome.COALESCED if coalesced else Slot.Outcome.STARTED,
        run=run,
        dispatched_at=timezone.now(),
    )


def record_install(policy_name: str, cron: str) -> None:
    """Start the clock of a schedule that was just installed or given another cron."""
    ScheduleInstall.objects.update_or_create(
        policy=policy_name, defaults={"cron": cron, "installed_at": timezone.now()}
    )


def lag_since(instants: list[datetime | None], cron: str, now: datetime) -> Lag:
    """How long ago the first slot after the latest of ``instants`` (the installation,
    the last firing; None where there is none) fell due.

    So a schedule just installed has missed nothing until its first slot is due, and a
    scheduler that restarts (firing the slot it missed, then skipping to the next one:
    ``catch_up`` is off) is on time again at once.
    """
    known = [t for t in instants if t is not None]
    if not known:
        return Lag(None, timedelta(0))
    expected = croniter(cron, max(known)).get_next(datetime)
    return Lag(expected, max(now - expected, timedelta(0)))


def schedule_period(cron: str, now: datetime) -> timedelta:
    """The gap between a schedule's next two slots."""
    slots = croniter(cron, now)
    first = slots.get_next(datetime)
    return slots.get_next(datetime) - first
