"""A run's frontier is read in one place: every shape the engine writes loads back, and
a shape changed by hand is reported as what it is, never a 500 or a traceback."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse

from cleanup.engine import frontier
from cleanup.engine.dispatch import dispatch
from cleanup.engine.window import top_up_now
from cleanup.models import Run
from cleanup.policies import get_policy
from tests.engine_app.factories import LeaseFactory

pytestmark = pytest.mark.django_db

# Frontiers as runs of the previous release stored them (a running run keeps its own).
STORED = [
    {"next_id": 5},
    {"partition": None, "next_id": 3},
    {"partition": 7, "next_id": 3},
    {"partition": "tenant-a", "next_id": 3},
    {"after": None},
    {"after": ["2026-11-30T10:00:00+00:00", 12]},
    {"after": ["-infinity", 3]},
    {"nulls_after": None},
    {"nulls_after": 4},
]
BY_HAND = [{"after": 5}, {"next_id": "x"}, {"next_id": True}, {}, [], "next",
           {"next_id": 1, "extra": 2}, {"after": ["2026-11-30", 1, 2]},
           {"partition": [1], "next_id": 3}, {"nulls_after": 1.5}]


@pytest.mark.parametrize("stored", STORED, ids=json.dumps)
def test_every_stored_shape_loads_and_dumps_back_unchanged(stored):
    assert frontier.dump(frontier.load(stored)) == stored


@pytest.mark.parametrize("stored", BY_HAND, ids=json.dumps)
def test_a_shape_the_engine_never_writes_is_refused_by_name(stored):
    with pytest.raises(frontier.BadFrontier, match="not one the engine writes"):
        frontier.load(stored)


@pytest.mark.parametrize("scheme", ["items", "range"])
def test_what_a_real_run_stores_loads(account, chunk_size, scheme):
    chunk_size("expire-leases", 2)
    LeaseFactory.create_batch(9, account=account, expired=True)
    run = dispatch("expire-leases", scheme=scheme).run
    run.refresh_from_db()
    assert run.frontier is not None  # still planning: more than a window of chunks
    assert frontier.dump(frontier.load(run.frontier)) == run.frontier


@pytest.fixture
def run_with_a_bad_frontier(account, chunk_size):
    chunk_size("expire-leases", 2)
    LeaseFactory.create_batch(12, account=account, expired=True)
    run = dispatch("expire-leases", scheme="items").run
    Run.objects.filter(pk=run.pk).update(frontier={"after": 5})
    return run


def test_a_bad_frontier_shows_on_the_run_page_and_the_lists(admin_client,
                                                              run_with_a_bad_frontier):
    run = run_with_a_bad_frontier
    page = admin_client.get(reverse("admin:cleanup_run_change", args=[run.pk]))

    assert page.status_code == 200
    assert "planning stopped: the run&#x27;s frontier {&#x27;after&#x27;: 5}" in (
        page.content.decode())
    assert admin_client.get(reverse("admin:cleanup_run_changelist")).status_code == 200


def test_a_bad_frontier_leaves_status_and_runs_working(run_with_a_bad_frontier):
    run = run_with_a_bad_frontier
    status, runs = StringIO(), StringIO()

    call_command("cleanup_status", str(run.pk), "--json", stdout=status)
    call_command("cleanup_runs", "--json", stdout=runs)

    assert json.loads(status.getvalue())["position"] is None
    assert [r["run_id"] for r in json.loads(runs.getvalue())["runs"]] == [str(run.pk)]


def test_a_bad_frontier_stops_that_run_planning_with_its_reason(run_with_a_bad_frontier):
    run = run_with_a_bad_frontier
    run.chunks.update(state="committed")

    top_up_now(get_policy("expire-leases"))

    run.refresh_from_db()
    assert "is not one the engine writes" in run.planning_error
    assert run.state == Run.State.RUNNING and run.frontier == {"after": 5}
