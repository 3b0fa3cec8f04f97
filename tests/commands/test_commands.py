"""The command-line contract: names, JSON keys, and clean failures that write nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone
from django_q.models import OrmQ

from cleanup.engine.worker import apply_chunk
from cleanup.models import Chunk, Run
from tests.conftest import ROOT, subprocess_env
from tests.engine_app.models import Lease

pytestmark = pytest.mark.django_db


def run_json(*args) -> dict:
    out = StringIO()
    call_command(*args, "--json", stdout=out)
    return json.loads(out.getvalue())


def test_dispatch_json_has_the_contract_keys(expired_leases):
    result = run_json("cleanup_dispatch", "--policy", "expire-leases", "--key", "k")

    assert result["created"] is True
    assert (result["policy"], result["scheme"], result["candidates"]) == (
        "expire-leases", "items", 5)
    assert result["chunks"]["total"] == result["chunks"]["enqueued"] == 1
    cutoff = Run.objects.get().cutoff
    assert result["cutoff"] == cutoff.isoformat(timespec="microseconds")
    assert result["run_id"] == str(Run.objects.get().pk)


def test_dispatch_with_existing_key_reports_created_false(expired_leases):
    first = run_json("cleanup_dispatch", "--policy", "expire-leases", "--key", "k")
    again = run_json("cleanup_dispatch", "--policy", "expire-leases", "--key", "k")
    assert (again["created"], again["run_id"], again["scheme"]) == (False, first["run_id"],
                                                                    "items")


def test_dispatch_accepts_any_iso_cutoff_with_offset(expired_leases):
    cutoff = (timezone.now() - timedelta(minutes=1)).astimezone(
        timezone.get_fixed_timezone(-300))
    result = run_json("cleanup_dispatch", "--policy", "expire-leases", "--cutoff",
                      cutoff.isoformat())
    assert Run.objects.get().cutoff == cutoff
    # Stored and shown as the same instant in UTC.
    assert result["cutoff"] == cutoff.astimezone(UTC).isoformat(timespec="microseconds")


def test_dispatch_sync_applies_in_process(expired_leases):
    run_json("cleanup_dispatch", "--policy", "expire-leases", "--sync")
    assert Lease.objects.count() == 0
    assert OrmQ.objects.count() == 0


def test_dispatch_dry_run_writes_nothing(expired_leases):
    out = StringIO()
    call_command("cleanup_dispatch", "--policy", "expire-leases", "--dry-run", stdout=out)
    assert out.getvalue().startswith("Dry run: expire-leases would plan 1 chunk (items) for 5")
    assert Run.objects.count() == 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--policy", "nope"], "unknown policy 'nope'"),
        (["--policy", "expire-leases", "--cutoff", "yesterday"], "not an ISO-8601 timestamp"),
        (["--policy", "expire-leases", "--cutoff", "2026-01-01T00:00:00"], "no timezone offset"),
        (["--policy", "expire-leases", "--cutoff", "2999-01-01T00:00:00+00:00"], "in the future"),
    ],
)
def test_dispatch_errors_are_one_clear_line_and_write_nothing(expired_leases, args, message):
    with pytest.raises(CommandError, match=message):
        call_command("cleanup_dispatch", *args)
    assert (Run.objects.count(), OrmQ.objects.count()) == (0, 0)


def test_dispatch_bad_scheme_is_refused(expired_leases):
    with pytest.raises(CommandError, match="invalid choice: 'diagonal'"):
        call_command("cleanup_dispatch", "--policy", "expire-leases", "--scheme", "diagonal")
    assert Run.objects.count() == 0


def test_status_json_reports_chunks_by_state_and_totals(expired_leases):
    dispatched = run_json("cleanup_dispatch", "--policy", "expire-leases")
    chunk = Chunk.objects.get()
    apply_chunk(chunk.message)
    apply_chunk(chunk.message)

    status = run_json("cleanup_status")

    assert status["run_id"] == dispatched["run_id"]
    assert status["state"] == "completed"
    assert status["cutoff"] == dispatched["cutoff"]
    assert status["chunks"] == {
        "planned": 0, "enqueued": 0, "retrying": 0, "committed": 1, "acknowledged": 0,
        "dead_lettered": 0, "discarded": 0, "cancelled": 0, "total": 1,
    }
    assert (status["rows_deleted"], status["noop_deliveries"], status["deliveries"]) == (5, 1, 2)


def test_status_of_unknown_run_fails(db):
    with pytest.raises(CommandError, match="no run with id 1234"):
        call_command("cleanup_status", "--run", "1234")


def test_replay_same_cutoff_resends_committed_chunks_as_noops(expired_leases):
    dispatched = run_json("cleanup_dispatch", "--policy", "expire-leases")
    chunk = Chunk.objects.get()
    apply_chunk(chunk.message)
    OrmQ.objects.all().delete()

    result = run_json("cleanup_replay", dispatched["run_id"])

    assert (result["run_id"], result["resent"]) == (dispatched["run_id"], 1)
    assert OrmQ.objects.count() == 1
    apply_chunk(chunk.message)
    chunk.refresh_from_db()
    assert (chunk.state, chunk.rows_deleted, chunk.noop_deliveries) == ("committed", 5, 1)


def test_replay_with_new_cutoff_creates_a_linked_run(expired_leases):
    dispatched = run_json("cleanup_dispatch", "--policy", "expire-leases", "--cutoff",
                          (timezone.now() - timedelta(days=3)).isoformat())
    new_cutoff = timezone.now().isoformat()

    result = run_json("cleanup_replay", dispatched["run_id"], "--new-cutoff", new_cutoff)
    again = run_json("cleanup_replay", dispatched["run_id"], "--new-cutoff", new_cutoff)

    replayed = Run.objects.get(pk=result["run_id"])
    assert str(replayed.replay_of_id) == dispatched["run_id"]
    assert replayed.trigger == Run.Trigger.REPLAY
    assert (result["resent"], result["created"]) == (1, True)
    assert (again["run_id"], again["created"]) == (result["run_id"], False)


def test_replay_refuses_cutoff_before_original_or_in_future(expired_leases):
    dispatched = run_json("cleanup_dispatch", "--policy", "expire-leases")
    before = (timezone.now() - timedelta(days=1)).isoformat()
    with pytest.raises(CommandError, match="before the original run"):
        call_command("cleanup_replay", dispatched["run_id"], "--new-cutoff", before)
    with pytest.raises(CommandError, match="in the future"):
        call_command("cleanup_replay", dispatched["run_id"], "--new-cutoff",
                     "2999-01-01T00:00:00+00:00")
    assert Run.objects.count() == 1


def test_replay_of_unknown_run_or_chunk_fails_and_sends_nothing(expired_leases):
    dispatched = run_json("cleanup_dispatch", "--policy", "expire-leases")
    OrmQ.objects.all().delete()
    with pytest.raises(CommandError, match="no run with id"):
        call_command("cleanup_replay", "00000000-0000-0000-0000-000000000000")
    with pytest.raises(CommandError, match="has no chunk 7"):
        call_command("cleanup_replay", dispatched["run_id"], "--chunk", "1", "--chunk", "7")
    assert OrmQ.objects.count() == 0


@pytest.fixture
def schedule_without_the_product():
    """Run ``cleanup_schedule --json`` as an operator does, in a process that installs no
    product (the test's own process registers the product's policies and tasks): the
    engine and its test app (tests/engine_settings.py), whose schedules are then the
    only ones."""
    env = subprocess_env(DJANGO_SETTINGS_MODULE="tests.engine_settings")

    def schedule() -> dict:
        process = subprocess.run([sys.executable, "manage.py", "cleanup_schedule", "--json"],
                                 cwd=ROOT, env=env, capture_output=True, text=True,
                                 timeout=120)
        assert process.returncode == 0, process.stderr
        return json.loads(process.stdout)

    return schedule


# transaction=True: another process writes the schedules, and the flush at the test's
# end removes them.
@pytest.mark.django_db(transaction=True)
def test_schedule_command_twice_changes_nothing(schedule_without_the_product):
    first = schedule_without_the_product()
    second = schedule_without_the_product()
    # The engine's five retention policies, then its three minutely tasks: the engine
    # app's policies run on demand, and it registers no task of its own.
    assert first["created"] == [
        "cleanup:purge-cleanup-chunks", "cleanup:purge-cleanup-events",
        "cleanup:purge-cleanup-runs", "cleanup:purge-cleanup-slots",
        "cleanup:purge-task-results",
        "cleanup:reconcile", "cleanup:heartbeat", "cleanup:publish-events",
    ]
    assert second["unchanged"] == first["created"]
    assert second["created"] == second["updated"] == second["removed"] == []


def test_a_host_task_with_a_bad_cron_is_refused():
    from cleanup.scheduling.schedules import register_task

    with pytest.raises(ValueError, match="not a cron expression"):
        register_task("nightly", "myapp.tasks.nightly", "every night")
