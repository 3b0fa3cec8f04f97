"""A paused policy halts: it plans and sends nothing new, chunks in flight finish,
nothing fails for being halted, slots still join the run in flight, and resuming
refills the window at once; the status, the overview, /metrics and the commands say
why."""

from __future__ import annotations

import getpass
import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from cleanup.engine import halts, operations
from cleanup.engine.dispatch import describe_dispatch, dispatch, dispatch_in_process
from cleanup.engine.worker import Outcome, apply_chunk
from cleanup.exceptions import CleanupError
from cleanup.models import Chunk, Halt, Run
from cleanup.observability.overview import banner, overview
from cleanup.observability.status import run_summary
from tests.engine.test_window import drain, unfinished
from tests.engine_app.factories import LeaseFactory
from tests.engine_app.models import Lease
from tests.observability.test_metrics import scrape

pytestmark = pytest.mark.django_db
POLICY = "expire-leases"


@pytest.fixture
def backlog(account, settings, chunk_size):
    """Six expired leases, chunks of one, two in flight."""
    settings.CLEANUP_WINDOW = 2
    chunk_size(POLICY, 1)
    return LeaseFactory.create_batch(6, account=account, expired=True)


def test_a_paused_policy_finishes_what_is_in_flight_plans_nothing_and_resumes(backlog):
    run = dispatch(POLICY, scheme="range").run
    assert len(unfinished()) == 2

    paused = operations.pause_policy(POLICY, "nightly maintenance", actor="alice")
    assert paused.changed
    while chunks := unfinished():  # the chunks already sent finish...
        assert apply_chunk(chunks[0].message) == Outcome.DELETED
    run.refresh_from_db()
    # ...and their ends planned nothing: the run waits, running, nothing failed.
    assert (run.chunks_planned, run.state, run.planned_all) == (2, Run.State.RUNNING, False)
    assert not Chunk.objects.exclude(state=Chunk.State.ACKNOWLEDGED).exclude(
        state=Chunk.State.COMMITTED).exists()
    assert Lease.objects.count() == 4

    resumed = operations.resume_policy(POLICY, actor="bob")
    assert resumed.changed and resumed.planned == 2  # the window refilled at once
    drain()
    run.refresh_from_db()
    assert run.state == Run.State.COMPLETED and Lease.objects.count() == 0
    halt = Halt.objects.get()
    assert (halt.actor, halt.ended_by, halt.detail) == ("alice", "bob", "nightly maintenance")
    assert halt.ended_at is not None


def test_a_dispatch_while_paused_creates_its_run_and_says_why_nothing_is_planned(backlog):
    operations.pause_policy(POLICY, "replica rebuild")

    result = dispatch(POLICY)

    assert result.run.state == Run.State.RUNNING and result.run.chunks_planned == 0
    text = describe_dispatch(result)
    assert "the policy is paused " in text and ": replica rebuild;" in text
    assert f"cleanup_resume --policy {POLICY}" in text
    assert run_summary(result.run)["halted"] == [halts.describe(Halt.objects.get())]


def test_a_sync_dispatch_while_paused_hands_its_run_to_the_queue(backlog):
    operations.pause_policy(POLICY, "replica rebuild")

    result = dispatch_in_process(POLICY)

    assert result.applied.handed_over and result.applied.chunks == 0
    assert "the policy is halted" in result.applied.note
    assert Lease.objects.count() == 6


def test_a_slot_that_fires_while_paused_joins_the_run_in_flight(backlog):
    first = dispatch(POLICY, key="slot-1").run
    operations.pause_policy(POLICY, "maintenance")

    joined = dispatch(POLICY, key="slot-2", coalesce_within=timedelta(hours=1))

    assert joined.coalesced and joined.run.pk == first.pk
    assert Run.objects.count() == 1


def test_pausing_twice_and_resuming_twice_change_nothing_the_second_time(backlog):
    first = operations.pause_policy(POLICY, "one")
    again = operations.pause_policy(POLICY, "two")
    assert (again.changed, again.halt.pk, again.halt.detail) == (False, first.halt.pk, "one")

    assert operations.resume_policy(POLICY).changed
    assert not operations.resume_policy(POLICY).changed
    assert Halt.objects.count() == 1


def test_a_pause_needs_a_known_policy_and_a_reason_and_resume_a_pause(backlog):
    with pytest.raises(CleanupError, match="unknown policy 'nope'"):
        operations.pause_policy("nope", "why")
    with pytest.raises(CleanupError, match="a pause needs a reason"):
        operations.pause_policy(POLICY, "   ")
    with pytest.raises(CleanupError, match="is not paused"):
        operations.resume_policy(POLICY)
    assert not Halt.objects.exists()


def test_the_overview_and_metrics_show_the_halt_and_the_time_halted(backlog, client):
    halt = operations.pause_policy(POLICY, "maintenance", actor="alice").halt
    Halt.objects.filter(pk=halt.pk).update(began_at=timezone.now() - timedelta(minutes=3))
    now = timezone.now()

    alerts = banner([h for h in overview(now) if h.policy == POLICY], [{"taking_work": True}])
    halted = [alert for alert in alerts if alert.kind == "halted"]
    assert len(halted) == 1 and halted[0].detail.startswith("paused 3 min by alice: maintenance")

    samples = scrape(client)
    labels = frozenset({"policy": POLICY, "reason": "paused"}.items())
    assert samples["cleanup_policy_held", labels] == 1
    assert samples["cleanup_held_seconds_total", labels] >= 180

    operations.resume_policy(POLICY)
    samples = scrape(client)
    assert ("cleanup_policy_held", labels) not in samples
    assert samples["cleanup_held_seconds_total", labels] >= 180


def test_the_commands_pause_and_resume_with_json(backlog):
    out = StringIO()
    call_command("cleanup_pause", "--policy", POLICY, "--reason", "maintenance", "--json",
                 stdout=out)
    paused = json.loads(out.getvalue())
    assert (paused["paused"], paused["reason"], paused["detail"]) == (True, "paused",
                                                                      "maintenance")
    out = StringIO()
    call_command("cleanup_pause", "--policy", POLICY, "--reason", "again", stdout=out)
    assert out.getvalue().startswith(f"{POLICY} was already paused ")

    out = StringIO()
    call_command("cleanup_dispatch", "--policy", POLICY, "--json", stdout=out)
    dispatched = json.loads(out.getvalue())
    assert dispatched["halted"].startswith("paused ") and (
        f"by command ({getpass.getuser()}): maintenance" in dispatched["halted"])
    out = StringIO()
    call_command("cleanup_resume", "--policy", POLICY, "--json", stdout=out)
    resumed = json.loads(out.getvalue())
    assert resumed["resumed"] and resumed["ended_by"] == f"command ({getpass.getuser()})"

    with pytest.raises(CommandError, match="unknown policy 'nope'"):
        call_command("cleanup_pause", "--policy", "nope", "--reason", "x")
    assert Halt.objects.count() == 1


def test_the_halts_of_a_policy_no_longer_registered_can_be_ended(backlog):
    """A deploy removed the policy while it was paused (and halted by its pressure): its
    halts would stay open, and its halted gauge at 1, for ever."""
    Halt.objects.create(policy="ghost-policy", reason=Halt.PAUSED, detail="migration")
    Halt.objects.create(policy="ghost-policy", reason="replica_lag", detail="lag")
    out = StringIO()

    call_command("cleanup_resume", "--policy", "ghost-policy", stdout=out)

    assert not Halt.objects.filter(policy="ghost-policy", ended_at__isnull=True).exists()
    assert "Resumed ghost-policy" in out.getvalue()
    with pytest.raises(CommandError, match="unknown policy 'ghost-policy'"):
        call_command("cleanup_resume", "--policy", "ghost-policy", stdout=StringIO())


def test_a_pause_in_its_first_second_reads_just_now_not_zero_seconds():
    began = timezone.now()
    halt = Halt(policy="expire-leases", reason=Halt.PAUSED, detail="maintenance",
                actor="alice", began_at=began)

    assert halts.describe(halt, now=began) == "paused just now by alice: maintenance"
    assert halts.describe(halt, now=began + timedelta(seconds=0.9)).startswith(
        "paused just now")
    assert halts.describe(halt, now=began + timedelta(seconds=4)) == (
        "paused 4.0 s by alice: maintenance")
