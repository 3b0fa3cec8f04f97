"""Through a real qcluster: rows locked elsewhere do not slow a big run down, and a run
whose chunks all fail halts its policy instead of dead-lettering its backlog.

transaction=True: the cluster connects on its own and must see what the test committed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from django.db import connection, transaction

from cleanup.conf import conf
from cleanup.engine.dispatch import dispatch
from cleanup.models import Chunk, Halt, Run
from reservations.models import SeatHold
from reservations.policies import EXPIRE_HOLDS
from tests.conftest import ROOT, manage, subprocess_env, wait_for
from tests.engine.test_concurrency import Worker
from tests.factories import SectionFactory

pytestmark = [pytest.mark.qcluster, pytest.mark.django_db(transaction=True)]

BACKLOG = int(os.environ.get("LOCKED_ROWS_BACKLOG", 1_000_000))
LOCKED = 25
CLUSTER_ENV = {"Q_TIMEOUT": "60", "Q_RETRY": "90", "Q_POLL": "0.05", "Q_WORKERS": "2"}
TABLE = SeatHold._meta.db_table


@pytest.fixture
def cluster(tmp_path):
    # Its log goes to a file: a million rows' worth would fill a pipe nobody reads.
    with open(tmp_path / "qcluster.log", "w") as log:
        process = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "qcluster"],
                                   cwd=ROOT, env=subprocess_env(**CLUSTER_ENV), stdout=log,
                                   stderr=subprocess.STDOUT)
    yield process
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def expired_holds(rows: int) -> None:
    """``rows`` holds that expired over the last hour, oldest first by id."""
    section = SectionFactory()
    with connection.cursor() as cursor:
        cursor.execute(
            f'INSERT INTO "{TABLE}" (tenant_id, section_id, learner_ref, status, expires_at, '
            "created_at, updated_at) SELECT %s, %s, 'learner-' || g, 'held', "
            "now() - interval '1 hour' + g * interval '3 ms', now(), now() "
            "FROM generate_series(1, %s) AS g", [section.tenant_id, section.pk, rows])
        cursor.execute(f'ANALYZE "{TABLE}"')


def run_to_the_end(timeout: float = 600) -> tuple[Run, float]:
    """Dispatch the policy as its schedule would and wait for the run to end."""
    started = time.monotonic()
    run = dispatch(EXPIRE_HOLDS).run
    wait_for(lambda: Run.objects.get(pk=run.pk).state != Run.State.RUNNING,
             timeout=timeout, interval=0.05, what="the run to end")
    took = time.monotonic() - started
    run.refresh_from_db()
    return run, took


def settled() -> None:
    """Start a timed run as the other started: no dead rows of the run before for an
    autovacuum to take on meanwhile (the policy's vacuum indicator would slow the run
    down for it), and a fresh checkpoint (none falls inside the run, whose writes would
    then carry page images)."""
    with connection.cursor() as cursor:
        cursor.execute(f'VACUUM (ANALYZE) "{TABLE}"')
        cursor.execute("CHECKPOINT")


def totals(run: Run) -> tuple[int, int]:
    chunks = list(run.chunks.all())
    return sum(c.rows_deleted for c in chunks), sum(c.rows_locked for c in chunks)


def test_rows_locked_for_the_whole_run_do_not_slow_it_and_go_once_free(cluster, settings):
    settings.CLEANUP_CHUNK_BUDGET_MS = 40  # dispatch sizes the first chunks as the cluster does
    expired_holds(BACKLOG)
    settled()
    unblocked, unblocked_s = run_to_the_end()
    assert unblocked.state == Run.State.COMPLETED
    assert totals(unblocked) == (BACKLOG, 0)

    expired_holds(BACKLOG)
    settled()
    # The oldest expired holds, which the run plans first, kept locked by another
    # session for the whole run (a report holding them FOR UPDATE).
    first = list(SeatHold.objects.order_by("expires_at").values_list("pk", flat=True)[:LOCKED])
    ready, release = threading.Event(), threading.Event()

    def keep_locked():
        with transaction.atomic():
            assert len(list(SeatHold.objects.select_for_update().filter(pk__in=first))) == LOCKED
            ready.set()
            assert release.wait(900)

    holder = Worker(keep_locked)
    holder.start()
    assert ready.wait(10)
    try:
        blocked, blocked_s = run_to_the_end()
        still_locked = set(SeatHold.objects.values_list("pk", flat=True))
    finally:
        release.set()
        holder.outcome()

    print(f"\n{BACKLOG:,} expired holds: {unblocked_s:.2f} s unblocked, {blocked_s:.2f} s with "
          f"{LOCKED} of the first locked throughout (x{blocked_s / unblocked_s:.3f})")
    assert blocked.state == Run.State.COMPLETED
    assert totals(blocked) == (BACKLOG - LOCKED, LOCKED)
    assert still_locked == set(first)
    # What this guards is a stall: 25 locked rows once held 1.2 million holds for 15
    # minutes (x40 and more). The 1.2x is a measurement, reported side by side
    # in the closing notes (x1.001 on a quiet machine); CI's two busy cores have
    # measured up to x1.235 on it, so the bound leaves room for that noise.
    assert blocked_s <= 1.5 * unblocked_s, (blocked_s, unblocked_s)

    later, _ = run_to_the_end()
    assert later.state == Run.State.COMPLETED
    assert totals(later) == (LOCKED, 0)
    assert not SeatHold.objects.exists()
    # The ledger equals reality: every row counted deleted is gone, once.
    assert sum(totals(run)[0] for run in (blocked, later)) == BACKLOG


def test_a_run_whose_chunks_all_fail_holds_its_policy_until_resumed_after_the_fix(cluster):
    expired_holds(60_000)
    with connection.cursor() as cursor:
        cursor.execute("CREATE FUNCTION refuse_hold_deletes() RETURNS trigger LANGUAGE plpgsql "
                       "AS $$ BEGIN RAISE EXCEPTION 'seat hold deletes are refused'; END $$")
        cursor.execute(f'CREATE TRIGGER refuse BEFORE DELETE ON "{TABLE}" '
                       "FOR EACH ROW EXECUTE FUNCTION refuse_hold_deletes()")
    run = dispatch(EXPIRE_HOLDS).run

    halt = wait_for(lambda: Halt.objects.filter(policy=EXPIRE_HOLDS, reason=Halt.FAILING,
                                                ended_at__isnull=True).first(),
                    timeout=120, what="the policy to halt itself")
    wait_for(lambda: not Chunk.objects.filter(run=run, state__in=Chunk.UNFINISHED).exists(),
             timeout=120, what="the chunks in flight to end")
    run.refresh_from_db()
    dead = Chunk.objects.filter(run=run, state=Chunk.State.DEAD_LETTERED).count()
    # 11 of the last 20 halted it; the window's others then ended too; nothing more planned.
    assert run.state == Run.State.RUNNING
    assert 11 <= dead == run.chunks_planned <= 11 + conf.WINDOW
    assert halt.cause == "ProgrammingError: seat hold deletes are refused"
    assert SeatHold.objects.count() == 60_000
    time.sleep(2)
    assert Run.objects.get(pk=run.pk).chunks_planned == run.chunks_planned

    with connection.cursor() as cursor:
        cursor.execute(f'DROP TRIGGER refuse ON "{TABLE}"')
    for command in (["cleanup_requeue", str(run.pk), "--noinput"],
                    ["cleanup_resume", "--policy", EXPIRE_HOLDS, "--json"]):
        done = manage(*command)
        output, _ = done.communicate(timeout=60)
        assert done.returncode == 0, output
    assert json.loads(output.splitlines()[-1])["reason"] == "failing"
    wait_for(lambda: Run.objects.get(pk=run.pk).state == Run.State.COMPLETED, timeout=300,
             what="the resumed run to complete")
    assert not SeatHold.objects.exists()
    assert totals(Run.objects.get(pk=run.pk)) == (60_000, 0)
