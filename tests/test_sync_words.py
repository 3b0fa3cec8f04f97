"""What a dispatch says of a halted policy and of a --sync run it shared: a failing halt
waits for a resume (never "a worker looks again by itself"), a --sync process counts
the rows it applied apart from the run's and names who took its run over, and the
halt its own chunks opened is in its result."""

from __future__ import annotations

import json
import signal
import time
from io import StringIO

import pytest
from django.core.management import call_command

from cleanup import faults
from cleanup.engine import halts
from cleanup.engine.dispatch import dispatch
from cleanup.engine.pressure import Level, Signal
from cleanup.models import Halt, Run
from tests.conftest import manage, wait_for
from tests.engine_app.factories import AccountFactory, LeaseFactory


def dispatch_json(*args: str) -> dict:
    out = StringIO()
    call_command("cleanup_dispatch", "--policy", "expire-leases", "--json", *args, stdout=out)
    return json.loads(out.getvalue())


@pytest.mark.django_db
def test_a_dispatch_while_failing_says_it_waits_for_a_resume(expired_leases):
    halts.begin("expire-leases", Halt.FAILING, detail="run x: 3 of its last 4 chunks were "
                "dead-lettered", actor="engine")

    summary = dispatch("expire-leases").fields()["summary"]

    assert ("nothing more is planned until it is resumed (cleanup_resume --policy "
            "expire-leases)") in summary
    assert "looks again by itself" not in summary


def nightly_batch(policy, db) -> Signal:
    """A host's indicator that halts (CLEANUP_PRESSURE_INDICATORS)."""
    return Signal(Level.HALT, "batch_window", 42.0, 10.0, "nightly batch running")


@pytest.mark.django_db
def test_a_pressure_halt_still_says_it_clears_by_itself(expired_leases, settings):
    settings.CLEANUP_PRESSURE_INDICATORS = ["tests.test_sync_words.nightly_batch"]

    summary = dispatch("expire-leases").fields()["summary"]

    assert (": nightly batch running; nothing more is planned until that clears (a worker "
            "looks again by itself)") in summary


@pytest.mark.django_db
def test_a_sync_run_whose_own_chunks_halt_the_policy_says_so(settings, chunk_size):
    settings.CLEANUP_FAILING_CHUNKS = 2
    chunk_size("expire-leases", 1)
    LeaseFactory.create_batch(6, account=AccountFactory(), expired=True)

    def broken() -> None:
        raise ValueError("a predicate the host got wrong")

    with faults.injected(faults.BEFORE_COMMIT, broken):
        result = dispatch_json("--sync")

    (halt,) = halts.open_halts("expire-leases")
    assert halt.reason == Halt.FAILING
    assert result["halted"].startswith("failing ")
    assert result["halted"].endswith(f"halted until resumed: {halt.detail}")
    assert ("nothing more is planned until it is resumed (cleanup_resume --policy "
            "expire-leases)") in result["summary"]
    assert result["sync"]["rows_changed"] == result["sync"]["run_rows_changed"] == 0


SETTINGS = """
import os
import signal

from tests.settings import *  # noqa: F403
from cleanup import faults

LEASES_EXPIRE_CHUNK_SIZE = 2
CLEANUP_CHUNK_BUDGET_MS = 0
CLEANUP_SYNC_LEASE_SECONDS = 2
CLEANUP_IDLE_IN_TRANSACTION_TIMEOUT_MS = 1000
_applied = []


def _freeze_at_the_third_chunk():
    _applied.append(1)
    if len(_applied) == 3:
        os.kill(os.getpid(), signal.SIGSTOP)


if os.environ.get("FREEZE"):
    _freeze = faults.injected(faults.BEFORE_COMMIT, _freeze_at_the_third_chunk)
    _freeze.__enter__()
"""


# transaction=True: the frozen process and this test see each other's commits.
@pytest.mark.django_db(transaction=True)
def test_a_frozen_sync_process_counts_its_own_rows_and_names_the_process_that_took_over(
        tmp_path, settings):
    (tmp_path / "frozen_settings.py").write_text(SETTINGS)
    settings.LEASES_EXPIRE_CHUNK_SIZE = 2
    settings.CLEANUP_SYNC_LEASE_SECONDS = 2
    LeaseFactory.create_batch(20, account=AccountFactory(), expired=True)
    env = {"DJANGO_SETTINGS_MODULE": "frozen_settings", "PYTHONPATH": str(tmp_path)}
    frozen = manage("cleanup_dispatch", "--policy", "expire-leases", "--sync", "--key", "k",
                    FREEZE="1", **env)
    try:
        wait_for(lambda: frozen.poll() is not None or _stopped(frozen.pid), timeout=60,
                 what="the --sync to freeze")
        assert frozen.poll() is None, frozen.communicate()[0]
        time.sleep(2.5)  # past its lease
        out = StringIO()
        call_command("cleanup_dispatch", "--policy", "expire-leases", "--sync", "--key", "k",
                     stdout=out)
    finally:
        frozen.send_signal(signal.SIGCONT)
    output, _ = frozen.communicate(timeout=60)

    run = Run.objects.get()
    assert run.state == Run.State.COMPLETED
    assert frozen.returncode == 0, output
    summary = output.strip().splitlines()[-1]
    # It applied chunks #1 and #2 (4 rows) before freezing in #3, which the server
    # rolled back when it ended its idle session.
    assert ("applied here: 4 rows deleted in 2 chunks (the run's chunks: 20 of 20 rows "
            "deleted in all); taken over by another process applying it (--sync)") in summary
    assert "applied here: 16 rows deleted in 8 chunks (the run's chunks: 20 of 20 rows" in (
        out.getvalue())


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"
