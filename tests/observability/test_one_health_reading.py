"""One reading of a policy's health (cleanup.observability.overview) serves the console's
overview, cleanup_policies and /metrics: for the same database, each shows the same
backlog and the same last success, whatever the backlog's size.

Issue 45: the overview counted every eligible row while /metrics counted up to its cap,
and a test kept two schedule readers equal; the overview said 5 rows where /metrics
said 3 (at least), from two readings of one table.
"""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from cleanup.engine.dispatch import dispatch
from cleanup.engine.worker import apply_chunk
from cleanup.observability import backlog as backlog_module
from cleanup.policies import all_policies
from tests.engine_app.factories import LeaseFactory
from tests.observability.test_metrics import scrape, value

pytestmark = pytest.mark.django_db
OVERVIEW = reverse("admin:cleanup_cleanupoverview_changelist")
# The doors are read one after the other: an age read later is older by that much.
READ_APART = 30


@pytest.fixture(autouse=True)
def _a_fresh_process(monkeypatch):
    """No reading remembered from another test."""
    monkeypatch.setattr(backlog_module, "_over_budget", {})


@pytest.fixture
def leases_by_age(account):
    """Five expired leases, 1 to 5 hours ago."""
    now = timezone.now()
    return [LeaseFactory(account=account, expires_at=now - timedelta(hours=hours))
            for hours in (1, 2, 3, 4, 5)]


def backlogs_through_each_door(admin_client, client) -> dict[str, dict]:
    """Per policy, (rows, oldest eligible since or age) as each door shows them."""
    page = admin_client.get(OVERVIEW)
    assert page.status_code == 200
    samples = scrape(client)
    out = StringIO()
    call_command("cleanup_policies", "--json", stdout=out)
    listed = {p["policy"]: p["backlog"] for p in json.loads(out.getvalue())["policies"]}
    found = {}
    for health in page.context["policies"]:
        name, label = health.policy, {"policy": health.policy}
        found[name] = {
            "overview": (health.eligible_rows, health.eligible_at_least,
                         health.oldest_eligible_since),
            "cleanup_policies": (listed[name]["eligible_rows"], listed[name]["capped"],
                                 listed[name]["oldest_eligible_since"]),
            "metrics": (value(samples, "cleanup_eligible_rows", **label),
                        value(samples, "cleanup_backlog_exact", **label),
                        value(samples, "cleanup_oldest_eligible_age_seconds", **label)),
        }
    return found


def assert_one_backlog(doors: dict, rows: int, capped: bool, now) -> None:
    overview_rows, at_least, since = doors["overview"]
    assert (overview_rows, at_least) == (rows, capped)
    assert doors["cleanup_policies"] == (rows, capped, since and since.isoformat())
    metrics_rows, exact, age = doors["metrics"]
    assert (metrics_rows, exact) == (rows, 1)
    if since is None:
        assert age == 0
    else:
        assert 0 <= age - (now - since).total_seconds() < READ_APART


def test_below_the_cap_the_three_doors_show_one_backlog(admin_client, client, leases_by_age):
    now = timezone.now()
    doors = backlogs_through_each_door(admin_client, client)

    assert set(doors) == {policy.name for policy in all_policies()}
    leases = doors["expire-leases"]
    assert_one_backlog(leases, 5, False, now)
    assert 5 * 3600 <= (now - leases["overview"][2]).total_seconds() < 5 * 3600 + READ_APART
    for each in doors.values():
        assert_one_backlog(each, each["overview"][0], False, now)


def test_at_the_cap_the_three_doors_say_at_least_as_many(admin_client, client,
                                                         leases_by_age, monkeypatch):
    monkeypatch.setattr(backlog_module, "COUNT_CAP", 3)
    now = timezone.now()

    doors = backlogs_through_each_door(admin_client, client)

    assert_one_backlog(doors["expire-leases"], 3, True, now)
    # The oldest still exact: five hours, from the policy's index.
    assert 5 * 3600 <= (now - doors["expire-leases"]["overview"][2]).total_seconds() < (
        5 * 3600 + READ_APART)
    page = admin_client.get(OVERVIEW).content.decode()
    assert "at least 3 eligible now; oldest for 5.0 h" in page
    out = StringIO()
    call_command("cleanup_policies", stdout=out)
    block = next(b for b in out.getvalue().split("\n\n") if b.startswith("expire-leases "))
    assert "  backlog   at least 3 rows eligible, the oldest waiting 5.0 h" in block


def test_the_last_success_is_one_run_on_every_door(admin_client, client, leases_by_age):
    run = dispatch("expire-leases").run
    apply_chunk(run.chunks.get().message)
    run.refresh_from_db()
    assert run.finished_at is not None

    page = admin_client.get(OVERVIEW)
    [leases] = [h for h in page.context["policies"] if h.policy == "expire-leases"]
    out = StringIO()
    call_command("cleanup_policies", "--json", stdout=out)
    [listed] = [p for p in json.loads(out.getvalue())["policies"]
                if p["policy"] == "expire-leases"]
    gauge = value(scrape(client), "cleanup_last_success_timestamp_seconds",
                  policy="expire-leases")
    health = client.get("/health").json()

    assert leases.last_success.pk == run.pk
    assert listed["last_success"] == {"run_id": str(run.pk),
                                      "finished_at": run.finished_at.isoformat()}
    assert gauge == run.finished_at.timestamp()
    assert health["last_completed_run"]["expire-leases"] == run.finished_at.isoformat()


def test_a_scrape_past_its_budget_does_not_stop_the_console_reading_within_its_own(
        admin_client, client, leases_by_age, monkeypatch):
    monkeypatch.setattr(backlog_module, "COUNT_CAP", 3)
    oldest = backlog_module._oldest

    def slow_index(rows, field):
        """The index probe past a scrape's 40 ms, well within the console's second."""
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(0.2)")
        return oldest(rows, field)
    monkeypatch.setattr(backlog_module, "_oldest", slow_index)

    assert value(scrape(client), "cleanup_backlog_exact", policy="expire-leases") == 0
    page = admin_client.get(OVERVIEW)

    [leases] = [h for h in page.context["policies"] if h.policy == "expire-leases"]
    assert (leases.eligible_rows, leases.eligible_at_least) == (3, True)
    assert "at least 3 eligible now; oldest for 5.0 h" in page.content.decode()
