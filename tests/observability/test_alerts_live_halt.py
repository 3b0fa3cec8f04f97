"""A halt on the live system: an operator's pause, seen by a real Prometheus server
evaluating the shipped rules (their for: cut short, as tests/observability/test_alerts_live.py does)
while a real qcluster's scheduler fires the paused policy's slots and its workers wait.

A halt is neither a missed schedule nor stalled work (invariant 10): through the whole
pause the slots fire and are dispatched (the first starts a run that plans nothing,
the next joins it), so CleanupScheduleMissed and CleanupWorkStalled never go pending,
and only CleanupHeldTooLong says that expired rows are waiting. Resuming clears it and
the run removes the backlog.

transaction=True: the subprocesses connect to the test database on their own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from datetime import timedelta

import pytest
from django.utils import timezone

from cleanup.models import Halt, Run, Slot
from cleanup.policies import all_policies
from reservations.models import SeatHold
from tests.conftest import ROOT, subprocess_env, wait_for
from tests.factories import SeatHoldFactory, SectionFactory
from tests.observability.test_alerts_live import (
    MISSED,
    PROMETHEUS,
    SHORT_LEASE,
    STALLED,
    System,
    watch,
)

pytestmark = [
    pytest.mark.prometheus,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(PROMETHEUS is None and os.environ.get("CI") != "true",
                       reason="prometheus not installed (apt-get install prometheus)"),
]
HELD, DEAD = "CleanupHeldTooLong", "CleanupDeadLetters"
POLICY = "expire-holds"
LEASE = timedelta(seconds=int(SHORT_LEASE["Q_TIMEOUT"]) + int(SHORT_LEASE["Q_RETRY"]))
BACKLOG = 2300  # more chunks of 500 than the window (4) holds: more are planned as they end
# django-q2's scheduler passes come every 30 s, the first about 30 s after its cluster
# starts; a pass fires at most one slot of a schedule. Slotted every 30 s (the shipped
# schedule is minutely), the paused policy sees a slot fire at each pass: two in about
# a minute, where minutely slots would take a minute and a half.
EXPIRE_SCHEDULE = "* * * * * */30"


class HeldSystem(System):
    """The live system of tests/observability/test_alerts_live.py, with the schedule above."""

    def _start(self, name: str, args: list[str], **env: str) -> None:
        super()._start(name, args, E2E_EXPIRE_SCHEDULE=EXPIRE_SCHEDULE, **env)

    def command(self, *args: str) -> str:
        """Run a management command as an operator would; return what it printed."""
        env = subprocess_env(DJANGO_SETTINGS_MODULE="tests.e2e_settings",
                             E2E_EXPIRE_SCHEDULE=EXPIRE_SCHEDULE)
        return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, check=True,
                              capture_output=True, text=True, env=env).stdout


def prometheus_alerts(system: HeldSystem, name: str) -> list[dict]:
    """The alerts named ``name`` as Prometheus's own API lists them, labels and all."""
    answer = system.get(system.api("alerts")) or {"data": {"alerts": []}}
    return [a for a in answer["data"]["alerts"] if a["labels"]["alertname"] == name]


def instant(system: HeldSystem, query: str) -> list:
    url = system.api(f"query?query={urllib.request.quote(query)}")
    return (system.get(url) or {"data": {"result": []}})["data"]["result"]


@pytest.fixture
def system(tmp_path):
    live = HeldSystem(tmp_path)
    yield live
    for name in list(live.processes):
        live.stop(name)


def test_a_pause_is_held_too_long_never_a_missed_schedule_nor_stalled_work_live(system):
    began, timings = time.time(), {}
    section = SectionFactory(capacity=BACKLOG + 10)
    SeatHold.objects.bulk_create(SeatHoldFactory.build_batch(BACKLOG, section=section,
                                                             expired=True))
    renewed = SeatHoldFactory(section=section)  # held until a quarter of an hour from now
    everyone = {policy.name for policy in all_policies()}
    quiet = {MISSED, STALLED, DEAD}

    system.manage("web", "runserver", "--noreload", f"127.0.0.1:{system.web_port}",
                  **SHORT_LEASE)
    system.start_prometheus()
    assert system.command("cleanup_pause", "--policy", POLICY, "--reason",
                          "nightly maintenance") == (
        f"Paused {POLICY}: nothing new is planned until cleanup_resume --policy {POLICY}.\n")
    pause = Halt.objects.get(policy=POLICY, reason=Halt.PAUSED, ended_at__isnull=True)
    system.command("cleanup_schedule")
    system.manage("cluster", "qcluster", Q_POLL="0.1", E2E_SCHEDULER="1", **SHORT_LEASE)
    cluster_started = time.monotonic()
    wait_for(lambda: system.text(f"http://127.0.0.1:{system.web_port}/metrics"),
             timeout=30, what="the app to serve /metrics")

    # Halted: the scheduler fires two slots, the workers dispatch both (a run that plans
    # nothing, then the slot that joins it while older than the redelivery window), and
    # the redelivery window passes after the last: only the halt is reported.
    def two_slots_held(alerts) -> bool:
        if alerts.get((HELD, POLICY)) == "firing":
            timings.setdefault("halted alert firing (from the pause)",
                               time.time() - pause.began_at.timestamp())
        slots = list(Slot.objects.filter(policy=POLICY, fired_at__gte=pause.began_at))
        return (alerts.get((HELD, POLICY)) == "firing" and len(slots) >= 2
                and all(slot.outcome != Slot.Outcome.FIRED for slot in slots)
                and max(slot.fired_at for slot in slots) < timezone.now() - LEASE)
    watch(system, two_slots_held, forbidden=quiet, policies=everyone, timeout=110,
          what="two slots of the paused policy to fire and be dispatched, a lease ago")
    timings["halted through two slots (from the cluster's start)"] = (
        time.monotonic() - cluster_started)
    [held] = prometheus_alerts(system, HELD)
    assert held["labels"] == {"alertname": HELD, "policy": POLICY, "reason": "paused",
                              "severity": "ticket"}
    assert held["state"] == "firing"
    assert held["annotations"]["summary"] == (
        f"{POLICY}: halted (paused) for more than 30 minutes")
    slots = Slot.objects.filter(policy=POLICY, fired_at__gte=pause.began_at).order_by("fired_at")
    outcomes = [slot.outcome for slot in slots]
    assert outcomes == [Slot.Outcome.STARTED] + [Slot.Outcome.COALESCED] * (len(outcomes) - 1)
    [run] = Run.objects.filter(policy=POLICY)
    assert {slot.run_id for slot in slots} == {run.pk}
    assert (run.state, run.chunks_planned, run.planned_all) == (Run.State.RUNNING, 0, False)
    assert SeatHold.objects.count() == BACKLOG + 1

    # Resumed: the halt ends, its alert clears and the run removes the backlog.
    resumed = time.monotonic()
    assert system.command("cleanup_resume", "--policy", POLICY).startswith(
        f"Resumed {POLICY} after it was paused")

    def cleaned(alerts) -> bool:
        return ((HELD, POLICY) not in alerts
                and Run.objects.filter(pk=run.pk, state=Run.State.COMPLETED).exists())
    watch(system, cleaned, forbidden=quiet, policies=everyone, timeout=40,
          what="the halted alert to clear and the run to complete")
    timings["resumed: alert cleared and run completed"] = time.monotonic() - resumed
    assert list(SeatHold.objects.values_list("pk", flat=True)) == [renewed.pk]
    run.refresh_from_db()
    assert run.candidates == BACKLOG and run.chunks_planned > run.window
    pause.refresh_from_db()
    assert pause.ended_at is not None

    # What Prometheus itself kept: the two alerts never pending nor firing, at all, and
    # the time halted counted up through the pause and not a second past its end.
    end = time.time()
    assert system.series(f'ALERTS{{alertname=~"{MISSED}|{STALLED}"}}', began, end) == []
    held_seconds = f'cleanup_held_seconds_total{{policy="{POLICY}",reason="paused"}}'
    [during] = system.series(held_seconds, began, pause.ended_at.timestamp())
    counted = [float(value) for _, value in during["values"]]
    assert counted == sorted(counted) and counted[-1] > counted[0]
    [now] = instant(system, held_seconds)
    assert float(now["value"][1]) == pytest.approx(
        (pause.ended_at - pause.began_at).total_seconds(), abs=0.001)
    assert instant(system, f'cleanup_policy_held{{policy="{POLICY}"}}') == []
    timings["whole test"] = time.time() - began
    seen = sorted({result["metric"]["alertname"] for result in system.series("ALERTS", began, end)})
    print("halt alert timings (s):", json.dumps(timings), "alerts seen:", seen)
