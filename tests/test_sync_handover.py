"""A --sync chunk whose row lock outlasts the in-task retries is left to the queue's
retries like any other delivery: the run is handed to the workers, and the command says
so in one line (or one JSON object) and exits 0.

transaction=True throughout: the lock is held from a second real connection, which must
see the leases the test committed (and the subprocess must see them too).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import timedelta
from io import StringIO

import psycopg
import pytest
from django.core.management import call_command
from django.db import OperationalError
from django.utils import timezone
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from cleanup import faults
from cleanup.engine.worker import apply_chunk
from cleanup.models import Chunk, Run
from tests.conftest import ROOT, database_url, subprocess_env
from tests.engine_app.factories import AccountFactory, LeaseFactory
from tests.engine_app.models import Lease

pytestmark = pytest.mark.django_db(transaction=True)
LOCK_TIMEOUT = "OperationalError: canceling statement due to lock timeout"


def leases_in_expiry_order(count: int) -> list[Lease]:
    """Expired leases one second apart: items chunks take them in this order."""
    account = AccountFactory()
    now = timezone.now()
    return [LeaseFactory(account=account, expires_at=now - timedelta(hours=1, seconds=count - i))
            for i in range(count)]


def table_locked_elsewhere() -> psycopg.Connection:
    """A second real connection keeping the leases from being deleted (a migration's
    lock of the table): a lock no skipping of locked rows gets past."""
    holder = psycopg.connect(database_url())
    holder.execute(f"LOCK TABLE {Lease._meta.db_table} IN SHARE MODE")
    return holder


def queued_messages() -> list[dict]:
    return [SignedPackage.loads(q.payload)["args"][0] for q in OrmQ.objects.order_by("id")]


def assert_handed_to_the_queue_with_chunk_retrying(run: Run, failed: int) -> None:
    run.refresh_from_db()
    assert run.in_process is False and run.state == Run.State.RUNNING
    chunk = run.chunks.get(chunk_id=failed)
    assert (chunk.state, chunk.cause) == (Chunk.State.RETRYING, LOCK_TIMEOUT)
    unfinished = list(run.chunks.filter(state__in=Chunk.UNFINISHED).order_by("chunk_id"))
    assert {c.state for c in unfinished if c.chunk_id != failed} <= {Chunk.State.ENQUEUED}
    # Every unfinished chunk's message is in the queue, the retrying one's too.
    assert queued_messages() == [c.message for c in unfinished]


def finish_from_the_queue(run: Run) -> None:
    """Deliver what the queue holds, as a worker would, until the run completes."""
    while messages := queued_messages():
        OrmQ.objects.all().delete()
        for message in messages:
            apply_chunk(message)
    run.refresh_from_db()
    assert run.state == Run.State.COMPLETED


def test_a_sync_chunk_locked_past_the_in_task_retries_is_left_to_the_queue(settings,
                                                                           chunk_size):
    settings.CLEANUP_TRANSIENT_RETRIES = 1
    chunk_size("expire-leases", 2)
    leases_in_expiry_order(8)
    attempts = []

    def third_chunk_times_out():
        attempts.append(1)
        if len(attempts) > 2:  # chunks #1 and #2 went
            raise OperationalError("canceling statement due to lock timeout")

    out = StringIO()
    with faults.injected(faults.BEFORE_CHUNK_LOCK, third_chunk_times_out):
        call_command("cleanup_dispatch", "--policy", "expire-leases", "--sync", stdout=out)

    run = Run.objects.get()
    (line,) = out.getvalue().splitlines()
    assert re.fullmatch(
        rf"Dispatched run {run.id} of expire-leases \(items, cutoff [0-9-]+ [0-9:]+ UTC\): "
        r"8 rows eligible; 4 chunks planned \(8 rows\); applied here: 4 of 8 rows "
        rf"deleted in 2 chunks; chunk #3 met \"{LOCK_TIMEOUT}\" past 1 in-task retries: the "
        r"run is handed to the queue, which retries it\. State running; took [0-9.]+ s\.",
        line), line
    assert_handed_to_the_queue_with_chunk_retrying(run, failed=3)
    finish_from_the_queue(run)
    assert Lease.objects.count() == 0
    assert sum(c.rows_deleted for c in run.chunks.all()) == 8


SETTINGS = """
from tests.settings import *  # noqa: F403

# Chunks of 20 leases; a lock wait gives up within a fifth of a second, retried once.
LEASES_EXPIRE_CHUNK_SIZE = 20
CLEANUP_CHUNK_BUDGET_MS = 0
CLEANUP_LOCK_TIMEOUT_MS = 200
CLEANUP_TRANSIENT_RETRIES = 1
"""


def test_sync_json_with_a_row_locked_past_the_retries_is_one_object_and_exit_0(tmp_path):
    (tmp_path / "locked_settings.py").write_text(SETTINGS)
    leases = leases_in_expiry_order(100)
    renewed = LeaseFactory(account=leases[0].account)  # not expired: never deleted
    holder = table_locked_elsewhere()
    try:
        process = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), "cleanup_dispatch", "--policy",
             "expire-leases", "--sync", "--json"],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
            env=subprocess_env(DJANGO_SETTINGS_MODULE="locked_settings",
                               PYTHONPATH=str(tmp_path)))
    finally:
        holder.close()

    assert process.returncode == 0, process.stdout + process.stderr
    assert "Traceback" not in process.stderr
    (line,) = process.stdout.splitlines()
    result = json.loads(line)
    run = Run.objects.get()
    assert (result["run_id"], result["state"], result["eligible"]) == (
        str(run.id), "running", 100)
    assert result["sync"] == {
        "chunks_applied": 0, "rows_changed": 0, "run_rows_changed": 0, "rows_locked": 0,
        "handed_to_queue": True,
        "failed_chunk": 1,
        "cause": LOCK_TIMEOUT,
        "note": f'chunk #1 met "{LOCK_TIMEOUT}" past 1 in-task retries: the run is handed to '
                "the queue, which retries it",
    }
    assert result["summary"].endswith(
        "applied here: 0 of 100 rows deleted in 0 chunks; " + result["sync"]["note"] + ".")
    assert_handed_to_the_queue_with_chunk_retrying(run, failed=1)

    finish_from_the_queue(run)
    assert sum(c.rows_deleted for c in run.chunks.all()) == 100
    assert list(Lease.objects.all()) == [renewed]
