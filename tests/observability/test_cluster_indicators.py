"""A host's indicator turned hostile under a running qcluster: whatever it answers,
the policy halts with a reason an operator can read, counted on /metrics, with no
traceback; once it answers well again the run goes on by itself. A slow one never
makes a learner wait.

transaction=True: the cluster connects on its own and must see what the test committed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from cleanup.engine import pressure
from cleanup.engine.dispatch import dispatch
from cleanup.engine.pressure import INDICATOR_ERROR
from cleanup.models import Chunk, Halt, Run
from reservations.models import SeatHold
from reservations.policies import EXPIRE_HOLDS
from reservations.services import renew_hold
from tests.conftest import ROOT, subprocess_env, wait_for
from tests.observability.test_cluster_locked_and_failing import expired_holds, totals
from tests.observability.test_metrics import scrape, value

pytestmark = [pytest.mark.qcluster, pytest.mark.django_db(transaction=True)]

BACKLOG = 30_000
INDICATOR = "tests.hostile_indicators.answer"
SETTINGS = f"""
from tests.settings import *  # noqa: F403

CLEANUP_PRESSURE_INDICATORS = [{INDICATOR!r}]
CLEANUP_PRESSURE_CHECK_SECONDS = 0  # each top-up reads it afresh
CLEANUP_CHUNK_BUDGET_MS = 0  # chunks of 500: many of them, a few at a time
"""


def say(answer, word: str) -> None:
    """Set the indicator's word in one step: a worker reading the file as it is
    rewritten in place can find it empty (CI saw "answer failed: KeyError: ''")."""
    fresh = answer.with_name("answer.new")
    fresh.write_text(word)
    os.replace(fresh, answer)


@pytest.fixture
def indicator(tmp_path, settings, monkeypatch):
    """The indicator's answer, set by `say`; the cluster and this process both read it."""
    answer = tmp_path / "answer"
    say(answer, "ok")
    monkeypatch.setenv("HOSTILE_ANSWER_FILE", str(answer))
    settings.CLEANUP_PRESSURE_INDICATORS = [INDICATOR]
    settings.CLEANUP_PRESSURE_CHECK_SECONDS = 0
    pressure.forget()
    yield answer
    pressure.forget()


@pytest.fixture
def cluster(tmp_path, indicator):
    (tmp_path / "hostile_settings.py").write_text(SETTINGS)
    log_path = tmp_path / "qcluster.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "qcluster"], cwd=ROOT,
            env=subprocess_env(DJANGO_SETTINGS_MODULE="hostile_settings",
                               PYTHONPATH=f"{tmp_path}:{ROOT}", Q_POLL="0.05",
                               Q_TIMEOUT="60", Q_RETRY="90", Q_WORKERS="2"),
            stdout=log, stderr=subprocess.STDOUT)
    yield log_path
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def committed(run: Run) -> int:
    return Chunk.objects.filter(run=run, state__in=Chunk.DONE).count()


def open_halt() -> Halt | None:
    return Halt.objects.filter(policy=EXPIRE_HOLDS, ended_at__isnull=True).first()


def planning_stopped(run: Run) -> int:
    """Wait until nothing of the run is in flight, and check that nothing more is
    planned; return the chunks planned."""
    wait_for(lambda: not Chunk.objects.filter(run=run, state__in=Chunk.UNFINISHED).exists(),
             timeout=60, what="the chunks in flight to end")
    planned = Run.objects.get(pk=run.pk).chunks_planned
    time.sleep(1.5)
    assert Run.objects.get(pk=run.pk).chunks_planned == planned
    return planned


@pytest.mark.parametrize("word, reason, detail", [
    ("none", INDICATOR_ERROR, "answer returned None, not a Signal"),
    ("text", INDICATOR_ERROR, "answer returned 'HOLD', not a Signal"),
    ("plain-two", "host_busy", "the host says halt"),
    ("long-reason", "r" * 63 + "…", "a reason of 200 chars"),
    ("nul-detail", "host_busy", "one two"),
])
def test_a_hostile_answer_in_a_running_cluster_holds_with_a_reason_then_lets_go(
        cluster, indicator, client, word, reason, detail):
    expired_holds(BACKLOG)
    run = dispatch(EXPIRE_HOLDS).run
    wait_for(lambda: committed(run) >= 4, timeout=60, what="the run to be under way")

    say(indicator, word)
    halt = wait_for(open_halt, timeout=60, what="the policy to halt")
    planned = planning_stopped(run)
    halt.refresh_from_db()
    assert (halt.reason, halt.actor) == (reason, "engine")
    assert halt.detail.startswith(detail), halt.detail
    assert Run.objects.get(pk=run.pk).state == Run.State.RUNNING
    assert planned * 500 < BACKLOG  # it stopped well before the end of its backlog
    assert value(scrape(client), "cleanup_policy_held", policy=EXPIRE_HOLDS,
                 reason=reason) == 1

    say(indicator, "ok")
    wait_for(lambda: Run.objects.get(pk=run.pk).state == Run.State.COMPLETED, timeout=120,
             what="the run to go on by itself and complete")
    assert open_halt() is None
    assert totals(Run.objects.get(pk=run.pk)) == (BACKLOG, 0)
    assert not SeatHold.objects.exists()
    assert "Traceback" not in cluster.read_text()


def test_a_slow_indicator_holds_and_never_makes_a_learner_wait(cluster, indicator):
    expired_holds(BACKLOG)
    run = dispatch(EXPIRE_HOLDS).run
    wait_for(lambda: committed(run) >= 4, timeout=60, what="the run to be under way")

    say(indicator, "slow")  # 3 s an answer, read before each chunk's transaction
    waits, stop = [], threading.Event()

    def learner():
        # Renew holds of the chunks in flight, as learners whose seats are being freed.
        from django.db import connections
        try:
            while not stop.is_set():
                items = [pk for chunk in Chunk.objects.filter(
                    run=run, state__in=Chunk.UNFINISHED).only("message")
                    for pk, _ in chunk.message["items"][:3]]
                for pk in items:
                    started = time.monotonic()
                    with contextlib.suppress(Exception):  # deleted meanwhile: not renewed
                        renew_hold(pk)
                    waits.append(time.monotonic() - started)
                time.sleep(0.05)
        finally:
            connections.close_all()

    renewing = threading.Thread(target=learner, daemon=True)
    renewing.start()
    try:
        halt = wait_for(open_halt, timeout=60, what="the slow indicator to halt")
        planning_stopped(run)
    finally:
        stop.set()
        renewing.join(30)
    assert halt.reason == INDICATOR_ERROR
    assert "answer took 3.0 s to answer, more than 2 s" in halt.detail
    print(f"\n{len(waits)} renewals while the indicator took 3 s: slowest {max(waits):.3f} s")
    assert waits and max(waits) < 1.0

    say(indicator, "ok")
    wait_for(lambda: Run.objects.get(pk=run.pk).state == Run.State.COMPLETED, timeout=120,
             what="the run to complete once the indicator answers in time")
    assert "Traceback" not in cluster.read_text()
