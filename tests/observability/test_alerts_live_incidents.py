"""An operator's day with a table locked and a cluster stopped, on the live system:
gunicorn with two workers (as ``make serve`` runs it), a real qcluster with the shipped
schedules, and Prometheus scraping /metrics every 2 s with the shipped rules (their
for: shortened, the expressions untouched).

1. Two web workers, one backlog: each worker once kept its own last exact reading, and
   a table locked made them disagree from scrape to scrape (and page for a backlog
   already gone). Here both repeat the newest exact reading, kept in the database.
2. A report holds the holds' table ACCESS EXCLUSIVE: the dispatch gives up at each
   slot after its lock bound, with nothing changed, and CleanupStepBlocked fires naming
   the report's session; the cluster stays free (its heartbeat fresh, no task killed),
   and a dispatch by hand gives up in well under a second. Released, the backlog goes.
3. The cluster stopped (SIGTERM, as a deploy or ``make demo`` stops it): /health says
   so at once, and CleanupNoWorkerTakingWork fires.

Timings and what /health and the overview said are written to
artifacts/incidents-live.json.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import psycopg
import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from django_q.models import Failure

from cleanup.models import Run
from reservations.models import SeatHold
from tests.conftest import ROOT, database_url, subprocess_env, wait_for
from tests.factories import SeatHoldFactory, SectionFactory
from tests.observability.test_alerts_live import (
    ARTIFACTS,
    PROMETHEUS,
    System,
    firing,
    watch,
)

pytestmark = [
    pytest.mark.prometheus,
    pytest.mark.django_db(transaction=True),  # the processes connect on their own
    pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed"),
]
POLICY = "expire-holds"
BLOCKED, TOO_OLD = "CleanupStepBlocked", "CleanupBacklogTooOld"
NO_WORKER = "CleanupNoWorkerTakingWork"
SAMPLE = re.compile(r'^(\w+)(?:\{([^}]*)\})? (\S+)$', re.MULTILINE)


def run_manage(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=120,
                          env=subprocess_env(DJANGO_SETTINGS_MODULE="tests.e2e_settings"))


def reading(system: System) -> dict | None:
    """One scrape of /metrics by hand: which web worker answered (its process's start
    time) and what it said of the policy's backlog."""
    text = system.text(f"http://127.0.0.1:{system.web_port}/metrics")
    if text is None:
        return None
    found = {}
    for name, labels, value in SAMPLE.findall(text):
        if name == "process_start_time_seconds" or f'policy="{POLICY}"' in (labels or ""):
            found[name] = float(value)
    return found


def readings_until(system: System, done, limit: int = 200) -> list[dict]:
    """Scrape two at a time until ``done(seen)``: a sync worker answers one request at a
    time, so two sent together reach both workers (one after another, the kernel may
    hand every request to the same one)."""
    seen = []
    with ThreadPoolExecutor(2) as pool:
        while len(seen) < limit:
            for now in pool.map(lambda _: reading(system), range(2)):
                if now is not None:
                    seen.append(now)
            if done(seen):
                return seen
    raise AssertionError(f"not done after {limit} scrapes: {seen[-2:]}")


def workers(seen: list[dict]) -> set[float]:
    return {r["process_start_time_seconds"] for r in seen}


def exact(seen: list[dict], rows: int) -> list[dict]:
    return [r for r in seen if r.get("cleanup_backlog_exact") == 1
            and r.get("cleanup_eligible_rows") == rows]


def health(system: System) -> dict:
    """GET /health's body, whether it answers 200 or 503."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{system.web_port}/health",
                                    timeout=5) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as answer:
        return json.loads(answer.read())


def banner(client: Client) -> str:
    """What the overview's banner says, as text."""
    page = client.get("/admin/cleanup/cleanupoverview/").content.decode()
    found = re.search(r'<div id="status-banner"[^>]*>(.*?)</div>', page, re.S).group(1)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", found)).strip()


@pytest.fixture
def system(tmp_path):
    live = System(tmp_path)
    yield live
    for name in list(live.processes):
        live.stop(name)


def test_a_locked_table_and_a_stopped_cluster_page_for_what_they_are(system):
    ARTIFACTS.mkdir(exist_ok=True)
    section = SectionFactory()
    assert run_manage("cleanup_schedule").returncode == 0
    admin = User.objects.create_superuser("operator", "operator@example.org", "x")
    console = Client()
    console.force_login(admin)
    system._start("web", [sys.executable, "-m", "gunicorn", "config.wsgi", "--bind",
                          f"127.0.0.1:{system.web_port}", "--workers", "2"])
    system.manage("cluster", "qcluster", Q_POLL="0.1")
    wait_for(lambda: reading(system), timeout=30, what="gunicorn to serve /metrics")
    system.start_prometheus()
    wait_for(lambda: health(system)["healthy"], timeout=90, what="a cluster to take work")
    timings, said = {}, {}
    everyone = {POLICY, "purge-reminder-attempts", "mark-reminders-ready"}

    # 1. Two workers, one backlog. Paused, so the backlog stays while it is read.
    paused = run_manage("cleanup_pause", "--policy", POLICY, "--reason", "reading")
    assert paused.returncode == 0, paused.stderr
    # Expired just now: the backlog is young, and any CleanupBacklogTooOld false.
    SeatHoldFactory.create_batch(200, section=section, expires_at=timezone.now())
    first = readings_until(system, lambda seen: len(workers(exact(seen, 200))) == 2)
    SeatHoldFactory.create_batch(100, section=section, expires_at=timezone.now())
    readings_until(system, lambda seen: exact(seen, 300))  # one worker has read 300
    report = psycopg.connect(database_url(), application_name="nightly-report")
    report.execute(f"LOCK TABLE {SeatHold._meta.db_table} IN ACCESS EXCLUSIVE MODE")
    locked_at, pid = time.monotonic(), report.info.backend_pid
    try:
        during = readings_until(system, lambda seen: len(seen) >= 20 and len(workers(seen)) == 2)
        assert len(workers(first)) == 2
        assert {(r.get("cleanup_backlog_exact"), r.get("cleanup_eligible_rows"))
                for r in during} == {(0, 300)}

        # 2. The report's lock: the dispatch gives up at each slot, and pages.
        resumed = run_manage("cleanup_resume", "--policy", POLICY)
        assert resumed.returncode == 0, resumed.stderr
        started = time.monotonic()
        by_hand = run_manage("cleanup_dispatch", "--policy", POLICY)
        timings["a dispatch by hand behind the lock, s"] = round(time.monotonic() - started, 2)
        assert by_hand.returncode == 1
        assert f"held by nightly-report (pid {pid})" in by_hand.stderr
        said["cleanup_dispatch by hand"] = by_hand.stderr.strip()
        blocked = firing(BLOCKED, POLICY)
        timings["lock to CleanupStepBlocked firing, s"] = round(
            (time.monotonic() - locked_at) + watch(
                system, blocked, forbidden={TOO_OLD, NO_WORKER}, policies=everyone | {""},
                timeout=300, what="the blocked dispatch to page"), 1)
        alert = next(a for a in system.get(system.api("alerts"))["data"]["alerts"]
                     if a["labels"]["alertname"] == BLOCKED)
        assert alert["labels"]["blocker"] == f"nightly-report (pid {pid})"
        said["CleanupStepBlocked summary"] = alert["annotations"]["summary"]
        answer = health(system)
        assert answer["healthy"]  # the workers were not held: they beat on
        said["/health during the lock"] = {k: answer[k] for k in ("healthy", "clusters")}
        said["overview during the lock"] = banner(console)
        assert "Dispatch of expire-holds blocked by a lock" in said["overview during the lock"]
        assert not Failure.objects.exists()  # no task waited until it was killed
        assert not Run.objects.filter(policy=POLICY).exists()
    finally:
        report.close()
    released = time.monotonic()
    timings["release to the backlog gone, s"] = round(watch(
        system, lambda alerts: not SeatHold.objects.filter(
            expires_at__lt=timezone.now() - timedelta(seconds=1)).exists(),
        forbidden={TOO_OLD}, policies=everyone, timeout=180,
        what="the next slot to delete the backlog"), 1)
    timings["release to CleanupStepBlocked resolved, s"] = round(
        (time.monotonic() - released) + watch(
            system, lambda alerts: (BLOCKED, POLICY) not in alerts, forbidden={TOO_OLD},
            policies=everyone, timeout=120, what="the blocked-step alert to resolve"), 1)
    watch(system, lambda alerts: False, forbidden={TOO_OLD}, policies=everyone, timeout=20,
          what="twenty quiet seconds after the backlog went", expect_timeout=True)

    # 3. The cluster stopped as a deploy stops it.
    cluster = system.processes.pop("cluster")
    cluster.send_signal(signal.SIGTERM)
    stopped = time.monotonic()
    cluster.wait(60)
    wait_for(lambda: not health(system)["healthy"], timeout=30, interval=0.2,
             what="/health to say the cluster stopped")
    timings["SIGTERM to /health 503, s"] = round(time.monotonic() - stopped, 2)
    answer = health(system)
    assert answer["problem"].startswith("the cluster stopped")
    said["/health after the stop"] = answer["problem"]
    said["overview after the stop"] = banner(console)
    assert "the cluster stopped" in said["overview after the stop"]
    assert "All clear" not in said["overview after the stop"]
    timings["SIGTERM to CleanupNoWorkerTakingWork firing, s"] = round(
        (time.monotonic() - stopped) + watch(
            system, lambda alerts: alerts.get((NO_WORKER, "")) == "firing", forbidden=set(),
            policies=set(), timeout=60, what="the no-worker alert"), 1)

    (ARTIFACTS / "incidents-live.json").write_text(json.dumps(
        {"timings": timings, "said": said}, indent=1))
    print("incidents:", json.dumps({"timings": timings, "said": said}, indent=1))
