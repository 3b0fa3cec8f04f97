"""Schedules: a slot fired twice (or by two clusters) gives one run; catch-up is off."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from django.utils import timezone
from django_q.models import OrmQ, Schedule
from django_q.scheduler import scheduler
from django_q.signing import SignedPackage

from cleanup import policies
from cleanup.engine.dispatch import dispatch
from cleanup.engine.worker import apply_chunk
from cleanup.models import Run, ScheduleInstall, Slot
from cleanup.observability.overview import schedule_statuses
from cleanup.policies import all_policies, get_policy
from cleanup.scheduling.schedules import install_schedules
from cleanup.tasks import dispatch_scheduled

pytestmark = pytest.mark.django_db

# django-q2's scheduler closes "old" connections before it runs, which ends the test's
# wrapping transaction; the tests that call it commit for real.
real_scheduler = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def scheduled_leases():
    """The engine app's policies run on demand; here two of them run on a schedule,
    one every minute and one hourly."""
    with policies.registered(
        replace(get_policy("expire-leases"), schedule="* * * * *"),
        replace(get_policy("purge-lease-logs"), schedule="15 * * * *"),
    ):
        yield


def fire_due_schedules() -> list[dict]:
    """Let django-q2's own scheduler fire what is due; return the queued tasks."""
    OrmQ.objects.all().delete()
    scheduler()
    return [SignedPackage.loads(q.payload) for q in OrmQ.objects.all()]


@real_scheduler
def test_scheduler_passes_its_slot_and_a_slot_fired_twice_gives_one_run(expired_leases):
    install_schedules()
    slot = (timezone.now() - timedelta(minutes=10)).replace(second=0, microsecond=0)
    Schedule.objects.filter(name="cleanup:expire-leases").update(next_run=slot)

    (task,) = fire_due_schedules()
    Schedule.objects.filter(name="cleanup:expire-leases").update(next_run=slot)
    (again,) = fire_due_schedules()

    assert task["kwargs"]["scheduled_for"] == again["kwargs"]["scheduled_for"] == slot.isoformat()
    kwargs = {k: v for k, v in task["kwargs"].items() if k != "q_options"}
    first = dispatch_scheduled(**kwargs)
    for chunk in Run.objects.get().chunks.all():
        apply_chunk(chunk.message)
    second = dispatch_scheduled(**{k: v for k, v in again["kwargs"].items() if k != "q_options"})
    assert first == second
    run = Run.objects.get()
    assert run.trigger == Run.Trigger.SCHEDULE
    assert run.dispatch_key == f"schedule:expire-leases:{slot.isoformat()}"


def test_a_slot_fired_while_a_run_is_in_flight_is_coalesced_into_it(expired_leases):
    in_flight = dispatch("expire-leases").run
    slot = timezone.now().replace(second=0, microsecond=0)

    assert dispatch_scheduled("expire-leases", slot.isoformat()) == str(in_flight.pk)
    assert Run.objects.get() == in_flight
    recorded = Slot.objects.get()
    assert (recorded.outcome, recorded.run_id) == (Slot.Outcome.COALESCED, in_flight.pk)

    for chunk in in_flight.chunks.all():
        apply_chunk(chunk.message)
    # The same slot delivered again stays coalesced; the next slot starts a run.
    assert dispatch_scheduled("expire-leases", slot.isoformat()) == str(in_flight.pk)
    later = dispatch_scheduled("expire-leases", (slot + timedelta(minutes=1)).isoformat())
    assert later != str(in_flight.pk) and Run.objects.count() == 2


def test_slot_tasks_queued_during_a_stall_collapse_into_one_run(expired_leases):
    slot = timezone.now().replace(second=0, microsecond=0)
    queued = [slot - timedelta(minutes=n) for n in range(5, 0, -1)]

    runs = {dispatch_scheduled("expire-leases", s.isoformat()) for s in queued}

    assert len(runs) == 1 and Run.objects.count() == 1
    outcomes = list(Slot.objects.order_by("slot_at").values_list("outcome", flat=True))
    assert outcomes == [Slot.Outcome.STARTED] + [Slot.Outcome.COALESCED] * 4



def schedule_status(policy, now):
    """One policy's schedule as the overview, cleanup_policies and /metrics read it."""
    return schedule_statuses([policy], now)[policy.name]

@real_scheduler
def test_the_scheduler_records_each_slot_it_fires_once_whether_or_not_a_worker_runs_it(db):
    install_schedules()
    slot = (timezone.now() - timedelta(minutes=3)).replace(second=0, microsecond=0)
    Schedule.objects.filter(name="cleanup:expire-leases").update(next_run=slot)
    fire_due_schedules()
    Schedule.objects.filter(name="cleanup:expire-leases").update(next_run=slot)
    fire_due_schedules()  # fired twice (two clusters, a retried pass)

    recorded = Slot.objects.get(policy="expire-leases")
    assert (recorded.slot_at, recorded.outcome, recorded.run_id) == (slot, "fired", None)
    now = timezone.now()
    assert schedule_status(get_policy("expire-leases"), now).lag == timedelta(0)


def test_a_fresh_install_misses_nothing_until_its_first_slot_is_due(db):
    install_schedules()
    # The install's own instant: a clock read after it may have crossed a minute, and
    # the slot of that minute would then be due, rightly.
    now = ScheduleInstall.objects.order_by("installed_at").values_list(
        "installed_at", flat=True).first()
    for policy in all_policies():
        if policy.schedule:
            assert schedule_status(policy, now).lag == timedelta(0), policy.name
    hourly = get_policy("purge-lease-logs")  # "15 * * * *"
    first_slot = schedule_status(hourly, now).next_slot
    assert schedule_status(hourly, first_slot - timedelta(seconds=1)).lag == timedelta(0)
    late = schedule_status(hourly, first_slot + timedelta(minutes=5))
    assert (late.lag, late.expected_slot) == (timedelta(minutes=5), first_slot)


def test_a_run_in_flight_does_not_hide_a_scheduler_that_stopped_firing(expired_leases):
    install_schedules()
    dispatch("expire-leases")  # in flight, and stays so
    last_fire = timezone.now() - timedelta(minutes=16)
    ScheduleInstall.objects.update(installed_at=last_fire - timedelta(hours=1))
    Slot.objects.create(policy="expire-leases", slot_at=last_fire.replace(second=0),
                        fired_at=last_fire, outcome=Slot.Outcome.STARTED)

    status = schedule_status(get_policy("expire-leases"), timezone.now())
    assert status.lag > timedelta(minutes=14) and status.missed
    assert status.undispatched == 0


def test_a_fired_slot_no_worker_dispatched_is_stalled_work_not_a_missed_schedule(db):
    install_schedules()
    now = timezone.now()
    Slot.objects.create(policy="expire-leases", slot_at=now - timedelta(minutes=10),
                        fired_at=now - timedelta(minutes=10))
    Slot.objects.create(policy="expire-leases", slot_at=now.replace(second=0, microsecond=0),
                        fired_at=now)  # the scheduler still fires; no worker takes them

    status = schedule_status(get_policy("expire-leases"), now)
    assert (status.missed, status.undispatched) == (False, 1)


def test_stalled_run_does_not_block_the_schedule(expired_leases):
    stalled = dispatch("expire-leases").run
    Run.objects.filter(pk=stalled.pk).update(created_at=timezone.now() - timedelta(hours=1))
    slot = timezone.now().replace(second=0, microsecond=0)

    assert dispatch_scheduled("expire-leases", slot.isoformat()) is not None
    assert Run.objects.count() == 2


@real_scheduler
def test_late_schedule_fires_once_and_its_cutoff_covers_the_backlog(expired_leases):
    install_schedules()
    long_ago = timezone.now() - timedelta(hours=5)
    Schedule.objects.filter(name="cleanup:expire-leases").update(next_run=long_ago)

    (task,) = fire_due_schedules()

    assert Schedule.objects.get(name="cleanup:expire-leases").next_run > timezone.now()
    dispatch_scheduled(**{k: v for k, v in task["kwargs"].items() if k != "q_options"})
    run = Run.objects.get()
    assert run.cutoff > long_ago + timedelta(hours=4)  # frozen at dispatch, not the slot
    assert run.candidates == 5


def test_install_updates_a_changed_schedule_and_removes_an_unregistered_one(db, settings):
    install_schedules()
    Schedule.objects.filter(name="cleanup:expire-leases").update(cron="*/5 * * * *")
    Schedule.objects.create(name="cleanup:retired-policy", func="cleanup.tasks.dispatch_scheduled",
                            schedule_type=Schedule.MINUTES, minutes=5)

    changes = install_schedules()

    assert changes.updated == ["cleanup:expire-leases"]
    assert changes.removed == ["cleanup:retired-policy"]
    assert Schedule.objects.get(name="cleanup:expire-leases").cron == "* * * * *"


def test_a_host_task_gets_its_schedule_kept_and_removed_with_the_engines(monkeypatch):
    from cleanup.scheduling import schedules

    monkeypatch.setattr(schedules, "_tasks", {})
    schedules.register_task("nightly", "tests.engine_app.services.nightly", "0 3 * * *")
    changes = install_schedules()

    row = Schedule.objects.get(name="cleanup:nightly")
    assert "cleanup:nightly" in changes.created
    # Run by name, as a step: its statements wait for a lock at most their bound.
    assert (row.func, row.kwargs, row.cron, row.schedule_type) == (
        "cleanup.tasks.run_task", "{'name': 'nightly'}", "0 3 * * *", Schedule.CRON)

    schedules.register_task("nightly", "tests.engine_app.services.nightly", "0 4 * * *")
    assert install_schedules().updated == ["cleanup:nightly"]
    assert Schedule.objects.get(name="cleanup:nightly").cron == "0 4 * * *"

    schedules._tasks.clear()  # the host no longer registers it
    assert install_schedules().removed == ["cleanup:nightly"]
    assert not Schedule.objects.filter(name="cleanup:nightly").exists()
