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

from cleanup.engine.dispatch import dispatch, dispatch_in_process
from cleanup.engine.replay import replay
from cleanup.engine.worker import Outcome, apply_chunk
from cleanup.exceptions import BadCutoff
from cleanup.models import Chunk, Run
from tests.engine_app.factories import AccountFactory, LeaseLogFactory
from tests.engine_app.models import LeaseLog
from tests.engine_app.policies import PURGE_LEASE_LOGS

pytestmark = pytest.mark.django_db


@pytest.fixture
def logs(db):
    """Lease logs 40 and 20 days old, interleaved in one account's ids (one range)."""
    account = AccountFactory()
    now = timezone.now()
    made = {"40 days": [], "20 days": []}
    for _ in range(3):
        for age in made:
            days = int(age.split()[0])
            made[age].append(LeaseLogFactory(account=account,
                                             recorded_at=now - timedelta(days=days)))
    return made


def test_a_worker_with_another_retention_deletes_only_what_the_run_planned(settings, logs):
    settings.LEASES_LOG_RETENTION_DAYS = 30
    run = dispatch(PURGE_LEASE_LOGS).run
    deadline = run.cutoff - timedelta(days=30)
    assert run.parameters == {"recorded_before": deadline.isoformat()}
    (chunk,) = run.chunks.all()
    assert chunk.message["parameters"] == run.parameters

    settings.LEASES_LOG_RETENTION_DAYS = 10  # the worker's own settings
    assert apply_chunk(chunk.message) == Outcome.DELETED

    left = set(LeaseLog.objects.values_list("pk", flat=True))
    assert left == {a.pk for a in logs["20 days"]}


def test_a_replay_with_the_same_cutoff_keeps_the_frozen_deadline(settings, logs):
    settings.LEASES_LOG_RETENTION_DAYS = 30
    run = dispatch_in_process(PURGE_LEASE_LOGS).run
    settings.LEASES_LOG_RETENTION_DAYS = 10

    replay(run.pk)
    for chunk in Chunk.objects.filter(run=run):
        assert apply_chunk(chunk.message) == Outcome.NOOP

    assert LeaseLog.objects.count() == len(logs["20 days"])


def test_a_message_whose_parameters_differ_from_its_run_is_dead_lettered(logs):
    run = dispatch(PURGE_LEASE_LOGS).run
    chunk = run.chunks.get()
    later = (run.cutoff - timedelta(days=10)).isoformat()
    forged = {**chunk.message, "parameters": {"recorded_before": later}}

    assert apply_chunk(forged) == Outcome.DEAD_LETTERED
    chunk.refresh_from_db()
    assert chunk.state == Chunk.State.DEAD_LETTERED
    assert "parameters do not match" in chunk.last_error
    assert LeaseLog.objects.count() == 6


def test_status_json_shows_the_frozen_parameters(logs):
    run = dispatch(PURGE_LEASE_LOGS).run
    out = StringIO()
    call_command("cleanup_status", "--run", str(run.pk), "--json", stdout=out)
    assert json.loads(out.getvalue())["parameters"] == run.parameters


def test_a_deadline_before_year_1_is_refused_and_nothing_written(logs):
    with pytest.raises(BadCutoff, match="cannot derive its deadlines"):
        dispatch(PURGE_LEASE_LOGS, cutoff=datetime(1, 1, 5, tzinfo=UTC))
    assert not Run.objects.exists()


def test_the_run_page_shows_the_frozen_parameters(admin_client, logs):
    run = dispatch(PURGE_LEASE_LOGS).run
    page = admin_client.get(reverse("admin:cleanup_run_change", args=[run.pk]))
    assert f"recorded_before = {run.parameters['recorded_before']}" in page.content.decode()


def test_a_run_that_froze_no_parameters_is_dead_lettered_not_recomputed(settings, logs):
    chunk = dispatch(PURGE_LEASE_LOGS).run.chunks.get()
    # Dispatched before its policy derived any: its messages carry none either.
    Run.objects.filter(pk=chunk.run_id).update(parameters={})

    assert apply_chunk({**chunk.message, "parameters": {}}) == Outcome.DEAD_LETTERED
    chunk.refresh_from_db()
    assert "froze no parameters" in chunk.last_error
    assert LeaseLog.objects.count() == 6
