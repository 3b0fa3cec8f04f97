"""Schedules: a slot fired twice (or by two clusters) gives one run; catch-up is off."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from django_q.models import OrmQ, Schedule
from django_q.scheduler import scheduler
from django_q.signing import SignedPackage

from cleanup.dispatch import dispatch
from cleanup.models import Run
from cleanup.schedules import install_schedules
from cleanup.tasks import dispatch_scheduled
from cleanup.worker import apply_chunk

pytestmark = pytest.mark.django_db

# django-q2's scheduler closes "old" connections before it runs, which ends the test's
# wrapping transaction; the tests that call it commit for real.
real_scheduler = pytest.mark.django_db(transaction=True)


def fire_due_schedules() -> list[dict]:
    """Let django-q2's own scheduler fire what is due; return the queued tasks."""
    OrmQ.objects.all().delete()
    scheduler()
    return [SignedPackage.loads(q.payload) for q in OrmQ.objects.all()]


@real_scheduler
def test_scheduler_passes_its_slot_and_a_slot_fired_twice_gives_one_run(expired_holds):
    install_schedules()
    slot = (timezone.now() - timedelta(minutes=10)).replace(second=0, microsecond=0)
    Schedule.objects.filter(name="cleanup:expire-holds").update(next_run=slot)

    (task,) = fire_due_schedules()
    Schedule.objects.filter(name="cleanup:expire-holds").update(next_run=slot)
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
    assert run.dispatch_key == f"schedule:expire-holds:{slot.isoformat()}"


def test_slot_is_skipped_while_a_run_of_the_policy_is_in_flight(expired_holds):
    in_flight = dispatch("expire-holds").run
    slot = timezone.now().replace(second=0, microsecond=0)

    assert dispatch_scheduled("expire-holds", slot.isoformat()) is None
    assert Run.objects.get() == in_flight
    for chunk in in_flight.chunks.all():
        apply_chunk(chunk.message)
    assert dispatch_scheduled("expire-holds", slot.isoformat()) is not None


def test_stalled_run_does_not_block_the_schedule(expired_holds):
    stalled = dispatch("expire-holds").run
    Run.objects.filter(pk=stalled.pk).update(created_at=timezone.now() - timedelta(hours=1))
    slot = timezone.now().replace(second=0, microsecond=0)

    assert dispatch_scheduled("expire-holds", slot.isoformat()) is not None
    assert Run.objects.count() == 2


@real_scheduler
def test_late_schedule_fires_once_and_its_cutoff_covers_the_backlog(expired_holds):
    install_schedules()
    long_ago = timezone.now() - timedelta(hours=5)
    Schedule.objects.filter(name="cleanup:expire-holds").update(next_run=long_ago)

    (task,) = fire_due_schedules()

    assert Schedule.objects.get(name="cleanup:expire-holds").next_run > timezone.now()
    dispatch_scheduled(**{k: v for k, v in task["kwargs"].items() if k != "q_options"})
    run = Run.objects.get()
    assert run.cutoff > long_ago + timedelta(hours=4)  # frozen at dispatch, not the slot
    assert run.candidates == 5


def test_install_updates_a_changed_schedule_and_removes_an_unregistered_one(db, settings):
    install_schedules()
    Schedule.objects.filter(name="cleanup:expire-holds").update(cron="*/5 * * * *")
    Schedule.objects.create(name="cleanup:retired-policy", func="cleanup.tasks.dispatch_scheduled",
                            schedule_type=Schedule.MINUTES, minutes=5)

    changes = install_schedules()

    assert changes.updated == ["cleanup:expire-holds"]
    assert changes.removed == ["cleanup:retired-policy"]
    assert Schedule.objects.get(name="cleanup:expire-holds").cron == "* * * * *"
