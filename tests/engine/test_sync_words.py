"""What a dispatch says of a halted policy: a failing halt waits for a resume (never "a
worker looks again by itself"), and the halt a --sync run's own chunks opened is in its
result."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command

from cleanup import faults
from cleanup.engine import halts
from cleanup.engine.dispatch import dispatch
from cleanup.engine.pressure import Level, Signal
from cleanup.models import Halt
from tests.engine_app.factories import AccountFactory, LeaseFactory


def dispatch_json(*args: str) -> dict:
    out = StringIO()
    call_command("cleanup_dispatch", "--policy", "expire-leases", "--json", *args, stdout=out)
    return json.loads(out.getvalue())


@pytest.mark.django_db
def test_a_dispatch_while_failing_says_it_waits_for_a_resume(expired_leases):
    halts.begin("expire-leases", Halt.FAILING, detail="3 of the policy's last 4 chunks were "
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
    settings.CLEANUP_PRESSURE_INDICATORS = ["tests.engine.test_sync_words.nightly_batch"]

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
