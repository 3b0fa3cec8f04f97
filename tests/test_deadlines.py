"""A run freezes its predicate's parameters at dispatch: the cutoff and the deadlines a
policy derives from it. Workers and replays use the stored values, never a setting."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from cleanup.dispatch import dispatch
from cleanup.exceptions import BadCutoff
from cleanup.models import Chunk, Run
from cleanup.replay import replay
from cleanup.worker import Outcome, apply_chunk
from reservations.models import ReminderAttempt
from reservations.policies import PURGE_REMINDERS
from tests.factories import ReminderAttemptFactory, TenantFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def attempts(db):
    """Attempts 40 and 20 days old, interleaved in one tenant's ids (one range)."""
    tenant = TenantFactory()
    now = timezone.now()
    made = {"40 days": [], "20 days": []}
    for _ in range(3):
        for age in made:
            days = int(age.split()[0])
            made[age].append(ReminderAttemptFactory(tenant=tenant,
                                                    sent_at=now - timedelta(days=days)))
    return made


def test_a_worker_with_another_retention_deletes_only_what_the_run_planned(settings, attempts):
    settings.RESERVATIONS_REMINDER_RETENTION_DAYS = 30
    run = dispatch(PURGE_REMINDERS).run
    deadline = run.cutoff - timedelta(days=30)
    assert run.parameters == {"sent_before": deadline.isoformat()}
    (chunk,) = run.chunks.all()
    assert chunk.message["parameters"] == run.parameters

    settings.RESERVATIONS_REMINDER_RETENTION_DAYS = 10  # the worker's own settings
    assert apply_chunk(chunk.message) == Outcome.DELETED

    left = set(ReminderAttempt.objects.values_list("pk", flat=True))
    assert left == {a.pk for a in attempts["20 days"]}


def test_a_replay_with_the_same_cutoff_keeps_the_frozen_deadline(settings, attempts):
    settings.RESERVATIONS_REMINDER_RETENTION_DAYS = 30
    run = dispatch(PURGE_REMINDERS, sync=True).run
    settings.RESERVATIONS_REMINDER_RETENTION_DAYS = 10

    replay(run.pk)
    for chunk in Chunk.objects.filter(run=run):
        assert apply_chunk(chunk.message) == Outcome.NOOP

    assert ReminderAttempt.objects.count() == len(attempts["20 days"])


def test_a_message_whose_parameters_differ_from_its_run_is_dead_lettered(attempts):
    run = dispatch(PURGE_REMINDERS).run
    chunk = run.chunks.get()
    later = (run.cutoff - timedelta(days=10)).isoformat()
    forged = {**chunk.message, "parameters": {"sent_before": later}}

    assert apply_chunk(forged) == Outcome.DEAD_LETTERED
    chunk.refresh_from_db()
    assert chunk.state == Chunk.State.DEAD_LETTERED
    assert "parameters do not match" in chunk.last_error
    assert ReminderAttempt.objects.count() == 6


def as_version_2(message: dict) -> dict:
    """A range message as version 2 wrote it: no parameters, the partition as tenant_id."""
    old = {k: v for k, v in message.items() if k not in ("parameters", "partition")}
    return old | {"version": 2, "tenant_id": message["partition"]}


def test_a_version_2_message_uses_the_parameters_its_run_froze(settings, attempts):
    settings.RESERVATIONS_REMINDER_RETENTION_DAYS = 30
    chunk = dispatch(PURGE_REMINDERS).run.chunks.get()
    old_format = as_version_2(chunk.message)
    settings.RESERVATIONS_REMINDER_RETENTION_DAYS = 10

    assert apply_chunk(old_format) == Outcome.DELETED
    assert ReminderAttempt.objects.count() == len(attempts["20 days"])


def test_status_json_shows_the_frozen_parameters(attempts):
    run = dispatch(PURGE_REMINDERS).run
    out = StringIO()
    call_command("cleanup_status", "--run", str(run.pk), "--json", stdout=out)
    assert json.loads(out.getvalue())["parameters"] == run.parameters


def test_a_deadline_before_year_1_is_refused_and_nothing_written(attempts):
    with pytest.raises(BadCutoff, match="cannot derive its deadlines"):
        dispatch(PURGE_REMINDERS, cutoff=datetime(1, 1, 5, tzinfo=UTC))
    assert not Run.objects.exists()


def test_the_run_page_shows_the_frozen_parameters(admin_client, attempts):
    run = dispatch(PURGE_REMINDERS).run
    page = admin_client.get(reverse("admin:cleanup_run_change", args=[run.pk]))
    assert f"sent_before = {run.parameters['sent_before']}" in page.content.decode()


def test_a_run_that_froze_no_parameters_is_dead_lettered_not_recomputed(settings, attempts):
    chunk = dispatch(PURGE_REMINDERS).run.chunks.get()
    Run.objects.filter(pk=chunk.run_id).update(parameters={})  # planned before 0003
    old_format = as_version_2(chunk.message)

    assert apply_chunk(old_format) == Outcome.DEAD_LETTERED
    chunk.refresh_from_db()
    assert "froze no parameters" in chunk.last_error
    assert ReminderAttempt.objects.count() == 6
