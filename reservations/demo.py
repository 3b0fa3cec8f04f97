"""One real cleanup cycle through a qcluster, with learners racing it, and its report."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cleanup.dispatch import dispatch
from cleanup.models import Chunk, Run
from cleanup.policies import get_policy
from cleanup.replay import replay
from cleanup.status import run_summary
from reservations import seeding
from reservations.models import Reminder, ReminderAttempt, SeatHold, Section, Tenant
from reservations.policies import EXPIRE_HOLDS, PURGE_REMINDERS
from reservations.services import confirm_hold, renew_hold

MANAGE = Path(__file__).resolve().parent.parent / "manage.py"


@dataclass
class DemoReport:
    runs: list[dict] = field(default_factory=list)
    racing: dict = field(default_factory=dict)
    checks: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(self.checks.values())


def run_demo(*, expired: int, active: int, racers: int, timeout: float,
             say: Callable[[str], None]) -> DemoReport:
    """Seed, dispatch both policies, renew and confirm some candidates, let a qcluster work."""
    for model in (Reminder, SeatHold, ReminderAttempt, Section, Tenant):
        model.objects.all().delete()
    seeding.seed(tenants=3, expired=expired, active=active, confirmed=expired // 10,
                 attempts=expired, random_seed=1, progress=lambda *a: None)
    say(f"Seeded {expired} expired and {active} active holds.")

    holds_run = dispatch(EXPIRE_HOLDS).run
    reminders_run = dispatch(PURGE_REMINDERS).run
    # Learners act after planning and before the workers: their holds are in the
    # messages, and must survive them.
    planned = [pk for pk, _ in holds_run.chunks.get(chunk_id=1).message["items"][: 2 * racers]]
    renewed = [renew_hold(pk).pk for pk in planned[:racers]]
    confirmed = [confirm_hold(pk).pk for pk in planned[racers:]]
    say(f"Dispatched 2 runs; {len(renewed)} candidates renewed and {len(confirmed)} "
        "confirmed before any worker ran.")

    cluster = subprocess.Popen([sys.executable, str(MANAGE), "qcluster"],
                               env=os.environ.copy(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        runs = [holds_run, reminders_run]
        _wait(lambda: _settled(runs), timeout, "both runs to finish")
        say("Both runs finished; replaying the hold run with its own cutoff.")
        resent = replay(holds_run.pk).resent
        _wait(lambda: _noops(holds_run) >= resent and _settled(runs), timeout,
              "the replayed chunks to be delivered")
    finally:
        cluster.send_signal(signal.SIGTERM)
        cluster.wait(60)

    policy = get_policy(EXPIRE_HOLDS)
    report = DemoReport(runs=[run_summary(Run.objects.get(pk=r.pk)) for r in runs])
    survivors = SeatHold.objects.filter(pk__in=renewed + confirmed).count()
    report.racing = {"renewed": len(renewed), "confirmed": len(confirmed),
                     "survivors": survivors}
    report.checks = {
        "renewed and confirmed holds survived": survivors == len(renewed) + len(confirmed),
        "no hold eligible at the cutoff is left":
            not policy.eligible_rows(holds_run.frozen).exists(),
        "active holds untouched":
            SeatHold.objects.filter(status="held", expires_at__gt=holds_run.cutoff).count()
            >= active,
        "each expired hold deleted once, replays were no-ops":
            report.runs[0]["rows_deleted"] == expired - len(renewed) - len(confirmed)
            and report.runs[0]["noops"] >= resent,
    }
    return report


def _settled(runs: list[Run]) -> bool:
    return not Chunk.objects.filter(run__in=runs).exclude(
        state__in=(Chunk.State.ACKNOWLEDGED, Chunk.State.DEAD_LETTERED)).exists()


def _noops(run: Run) -> int:
    return sum(run.chunks.values_list("noop_deliveries", flat=True))


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.5)
