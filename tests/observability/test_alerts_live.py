"""The shipped alert rules on the live system: the app served over HTTP, a real
qcluster, and a real Prometheus server scraping /metrics and evaluating the rules
(their for: durations shortened, the expressions untouched).

Three scenarios, in the order an operator would meet them: a fresh install is quiet,
with a renewal reminder falling due and handled on time; work blocked on a lock
held by another connection is stalled work, not a missed schedule; a dead scheduler
is a missed schedule, for a policy with a chunk in flight and for one with nothing in
flight, not stalled work, and the reminders due meanwhile are late.

transaction=True: the subprocesses connect to the test database on their own.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from django.utils import timezone

from cleanup.engine.dispatch import dispatch
from cleanup.models import Run, Slot
from reservations.models import Reminder, SeatHold
from reservations.services import hold_seat
from tests.conftest import ROOT, database_url, subprocess_env, wait_for
from tests.factories import ReminderAttemptFactory, SeatHoldFactory, SectionFactory

PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    pytest.mark.prometheus,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(PROMETHEUS is None and os.environ.get("CI") != "true",
                       reason="prometheus not installed (apt-get install prometheus)"),
]
MISSED, STALLED, LATE = "CleanupScheduleMissed", "CleanupWorkStalled", "RemindersLate"
SHORT_LEASE = {"Q_TIMEOUT": "4", "Q_RETRY": "6"}  # lease 10 s
LONG_LEASE = {"Q_TIMEOUT": "60", "Q_RETRY": "120"}  # lease 180 s
ARTIFACTS = ROOT / "artifacts"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def shortened_rules(folder: Path, *, annotations: bool = True) -> Path:
    """The shipped rules with every for: cut to 4 s; the expressions stay as shipped.
    Without ``annotations``, for a replay that compares when alerts fire, not wording."""
    shipped = (ROOT / "deploy/prometheus/cleanup-alerts.yml").read_text()
    shortened, count = re.subn(r"(\n\s+for: )\d+[smh]", r"\g<1>4s", shipped)
    assert count >= 4
    if not annotations:
        shortened = re.sub(r"\n\s+annotations:(\n\s{10,}\S.*)+", "", shortened)
    path = folder / ("rules.yml" if annotations else "rules-without-annotations.yml")
    path.write_text(shortened)
    return path


class System:
    """The app, its cluster and a Prometheus server, as processes on this machine."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.web_port, self.prometheus_port = free_port(), free_port()
        self.processes: dict[str, subprocess.Popen] = {}

    def _start(self, name: str, args: list[str], **env: str) -> None:
        log = open(self.folder / f"{name}.log", "a")  # noqa: SIM115 - closed with the process
        self.processes[name] = subprocess.Popen(
            args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env=subprocess_env(DJANGO_SETTINGS_MODULE="tests.e2e_settings", **env))

    def manage(self, name: str, *args: str, **env: str) -> None:
        self._start(name, [sys.executable, str(ROOT / "manage.py"), *args], **env)

    def start_app(self, *, scheduler: bool, **lease: str) -> None:
        self.manage("web", "runserver", "--noreload", f"127.0.0.1:{self.web_port}", **lease)
        self.manage("cluster", "qcluster", Q_POLL="0.1",
                    E2E_SCHEDULER="1" if scheduler else "0", **lease)
        wait_for(lambda: self.text(f"http://127.0.0.1:{self.web_port}/metrics"),
                 timeout=30, what="the app to serve /metrics")

    def stop_app(self) -> None:
        for name in ("cluster", "web"):
            self.stop(name)

    def start_prometheus(self) -> None:
        config = self.folder / "prometheus.yml"
        config.write_text(json.dumps({
            "global": {"scrape_interval": "2s", "evaluation_interval": "2s"},
            "rule_files": [str(shortened_rules(self.folder))],
            "scrape_configs": [{"job_name": "cleanup",
                                "static_configs": [{"targets": [f"127.0.0.1:{self.web_port}"]}]}],
        }))
        self._start("prometheus", [PROMETHEUS, f"--config.file={config}",
                                   f"--storage.tsdb.path={self.folder / 'tsdb'}",
                                   f"--web.listen-address=127.0.0.1:{self.prometheus_port}"])
        wait_for(lambda: self.get(self.api("targets")), timeout=30,
                 what="Prometheus to start")

    def stop(self, name: str) -> None:
        """End a process and its children (a cluster's workers) at once."""
        process = self.processes.pop(name, None)
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def api(self, path: str) -> str:
        """The address of ``path`` on Prometheus's HTTP API."""
        return f"http://127.0.0.1:{self.prometheus_port}/api/v1/{path}"

    @staticmethod
    def text(url: str) -> str | None:
        """The body at ``url``, or None while it cannot be read."""
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.read().decode()
        except OSError:
            return None

    def get(self, url: str):
        """The JSON at ``url``, or None while it cannot be read."""
        text = self.text(url)
        return json.loads(text) if text else None

    def alerts(self) -> dict[tuple[str, str], str]:
        """Alert name and policy -> pending or firing, as Prometheus evaluates them now."""
        answer = self.get(self.api("alerts")) or {"data": {"alerts": []}}
        return {(a["labels"]["alertname"],
                 a["labels"].get("policy", a["labels"].get("state", ""))): a["state"]
                for a in answer["data"]["alerts"]}

    def series(self, query: str, start: float, end: float) -> list:
        url = self.api(f"query_range?query={urllib.request.quote(query)}"
                        f"&start={start}&end={end}&step=2")
        return (self.get(url) or {"data": {"result": []}})["data"]["result"]


@pytest.fixture
def system(tmp_path):
    live = System(tmp_path)
    yield live
    for name in list(live.processes):
        live.stop(name)


def watch(system: System, until, *, forbidden: set[str], policies: set[str],
          timeout: float, what: str, expect_timeout: bool = False) -> float:
    """Poll the alerts until ``until(alerts)``; fail if a forbidden alert is pending or
    firing for one of ``policies`` meanwhile. Return the seconds it took (with
    ``expect_timeout``, just watch for ``timeout`` seconds)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        alerts = system.alerts()
        seen = {(name, policy) for (name, policy) in alerts
                if name in forbidden and policy in policies}
        assert not seen, f"{seen} while waiting for {what}"
        if until(alerts):
            return time.monotonic() - started
        time.sleep(1)
    if expect_timeout:
        return timeout
    raise AssertionError(f"timed out after {timeout}s waiting for {what}: {system.alerts()}")


def firing(name: str, *policies: str):
    return lambda alerts: all(alerts.get((name, p)) == "firing" for p in policies)


def lock_the_holds_table() -> psycopg.Connection:
    """Another connection keeping the holds from being deleted, as a migration's lock of
    the table would. (Rows locked one by one no longer stall anything: a chunk skips
    them after CLEANUP_ROW_LOCK_WAIT_MS and a later run takes them.)"""
    holder = psycopg.connect(database_url())
    holder.execute(f"LOCK TABLE {SeatHold._meta.db_table} IN SHARE MODE")
    return holder


def test_alerts_tell_missed_schedules_from_stalled_work_on_the_live_system(system):
    ARTIFACTS.mkdir(exist_ok=True)
    began = time.time()
    section = SectionFactory()
    ReminderAttemptFactory.create_batch(3)
    subprocess.run([sys.executable, "manage.py", "cleanup_schedule"], cwd=ROOT, check=True,
                   env=subprocess_env(DJANGO_SETTINGS_MODULE="tests.e2e_settings"),
                   capture_output=True)
    system.start_app(scheduler=True, **SHORT_LEASE)
    system.start_prometheus()
    timings, phases = {}, {"healthy": time.time()}
    everyone = {"expire-holds", "purge-reminder-attempts", "purge-cleanup-chunks",
                "purge-cleanup-runs", "purge-task-results", "mark-reminders-ready",
                "pending", "ready"}
    # A renewal reminder falling due now: marked and sent within the schedules' limit.
    on_time = hold_seat(section.pk, "on-time", now=timezone.now() - timedelta(minutes=10))

    # A fresh install, healthy: quiet until a slot has fired and its run finished.
    def slot_done(alerts) -> bool:
        return Slot.objects.filter(policy="expire-holds", run__state=Run.State.COMPLETED,
                                   fired_at__lt=timezone.now() - timezone.timedelta(seconds=10)
                                   ).exists()
    timings["healthy, quiet until a slot ran"] = watch(
        system, slot_done, forbidden={MISSED, STALLED, LATE}, policies=everyone, timeout=150,
        what="a slot of expire-holds to fire and its run to complete")
    timings["healthy: the due reminder sent"] = watch(
        system, lambda alerts: Reminder.objects.filter(hold_id=on_time.pk, state="sent").exists(),
        forbidden={MISSED, STALLED, LATE}, policies=everyone, timeout=150,
        what="the scheduled marking and sender to send the due reminder")

    # Work blocked on a lock of the holds' table: stalled work, and the scheduler still
    # on time.
    SeatHoldFactory.create_batch(300, section=section, expired=True)
    phases["row locks"] = time.time()
    holder = lock_the_holds_table()
    try:
        dispatch("expire-holds")
        timings["row locks: stalled work fired (lease 10 s)"] = watch(
            system, firing(STALLED, "expire-holds"), forbidden={MISSED, LATE}, policies=everyone,
            timeout=90, what="stalled work on expire-holds")
        watch(system, lambda alerts: False, forbidden={MISSED}, policies=everyone,
              timeout=10, what="ten seconds of stalled work", expect_timeout=True)
    finally:
        holder.close()
    wait_for(lambda: not Run.objects.filter(state=Run.State.RUNNING).exists(), timeout=60,
             what="the blocked runs to finish once the locks went")

    # The scheduler dead, the workers alive: a missed schedule for a policy with a chunk
    # in flight (expire-holds, blocked again) and one with nothing in flight.
    wait_for(lambda: (STALLED, "expire-holds") not in system.alerts(), timeout=60,
             what="the stalled-work alert to resolve")
    system.stop_app()
    died, phases["scheduler dead"] = time.monotonic(), time.time()
    SeatHoldFactory.create_batch(5, section=section, expired=True)
    # A reminder that fell due while nothing marks or sends, four minutes ago.
    hold_seat(section.pk, "late", now=timezone.now() - timedelta(minutes=14))
    holder = lock_the_holds_table()
    try:
        system.start_app(scheduler=False, **LONG_LEASE)
        dispatch("expire-holds")
        timings["scheduler dead: missed schedule fired"] = (time.monotonic() - died) + watch(
            system, firing(MISSED, "expire-holds", "purge-reminder-attempts"),
            forbidden={STALLED}, policies=everyone, timeout=150,
            what="a missed schedule for both minutely policies")
        timings["scheduler dead: reminders late fired"] = (time.monotonic() - died) + watch(
            system, firing(LATE, "pending"), forbidden={STALLED}, policies=everyone,
            timeout=90, what="the unmarked reminder to be late")
        # Firing steadily, and still no stalled work, with the chunk still in flight.
        watch(system, lambda alerts: False, forbidden={STALLED}, policies=everyone,
              timeout=10, what="ten quiet seconds", expect_timeout=True)
        assert Run.objects.filter(policy="expire-holds", state=Run.State.RUNNING).exists()
    finally:
        holder.close()
    phases["end"] = time.time()

    # What the app really produced, for the promtool replay
    # (tests/observability/test_alert_replay.py).
    recording = {query: system.series(query, began, time.time()) for query in (
        "cleanup_schedule_lag_seconds", "cleanup_schedule_grace_seconds",
        "cleanup_stalled_chunks", "cleanup_undispatched_slots",
        "reservations_reminders_oldest_due_unsent_age_seconds",
        "reservations_reminder_late_limit_seconds",
        'ALERTS{alertname=~"CleanupScheduleMissed|CleanupWorkStalled|RemindersLate"}')}
    (ARTIFACTS / "alerts-live.json").write_text(json.dumps(
        {"timings_seconds": timings, "phases": phases, "series": recording}, indent=1))
    print("alert timings (s):", json.dumps(timings))
