"""The overview's status banner says what the alert rules say, and flags an old backlog."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from cleanup.engine.dispatch import dispatch
from cleanup.models import Chunk, ScheduleInstall
from cleanup.observability import health
from cleanup.scheduling.schedules import install_schedules
from tests.engine_app.factories import LeaseFactory
from tests.engine_app.models import Lease

pytestmark = pytest.mark.django_db

OVERVIEW = reverse("admin:cleanup_cleanupoverview_changelist")


def banner(client) -> list[tuple[str, str | None]]:
    return [(a.title, a.policy) for a in client.get(OVERVIEW).context["alerts"]]


@pytest.fixture
def healthy(expire_leases_scheduled):
    """Schedules just installed (expire-leases's each minute) and a cluster that beat a
    moment ago."""
    install_schedules()
    health.beat()


def test_a_healthy_install_says_all_clear(admin_client, healthy):
    page = admin_client.get(OVERVIEW).content.decode()

    assert banner(admin_client) == []
    assert "All clear" in page and 'id="overview-refresh"' in page
    assert "cleanup/overview.js" in page


def test_a_schedule_not_installed_is_never_all_clear(admin_client, expire_leases_scheduled):
    """A cluster beats but cleanup_schedule never ran: the banner says which policy is
    not on its schedule, not "All clear" (issue 47, item 5)."""
    health.beat()
    page = admin_client.get(OVERVIEW).content.decode()

    assert ("Schedule not installed", "expire-leases") in banner(admin_client)
    assert "All clear" not in page
    install_schedules()
    assert banner(admin_client) == []


def test_a_month_old_backlog_is_flagged_in_the_banner_and_the_table(admin_client, healthy):
    lease = LeaseFactory(expired=True)
    Lease.objects.filter(pk=lease.pk).update(expires_at=timezone.now() - timedelta(days=31))

    page = admin_client.get(OVERVIEW).content.decode()

    assert ("Backlog too old", "expire-leases") in banner(admin_client)
    assert "the oldest for 31 d, past its limit of" in page
    assert '<strong class="flag">1 eligible now' in page


def test_a_fresh_backlog_is_not_flagged(admin_client, healthy):
    LeaseFactory(expires_at=timezone.now() - timedelta(seconds=30))

    assert banner(admin_client) == []


def test_missed_schedule_stalled_work_and_dead_letters_each_have_their_line(
        admin_client, healthy, settings):
    ScheduleInstall.objects.update(installed_at=timezone.now() - timedelta(minutes=10))
    LeaseFactory.create_batch(2, expired=True)
    run = dispatch("expire-leases").run
    Chunk.objects.filter(run=run).update(planned_at=timezone.now() - timedelta(hours=1),
                                         enqueued_at=timezone.now() - timedelta(hours=1))
    dead = dispatch("expire-leases", key="dead").run
    Chunk.objects.filter(run=dead).update(state=Chunk.State.DEAD_LETTERED,
                                          cause="OperationalError: lock timeout")

    lines = banner(admin_client)
    page = admin_client.get(OVERVIEW).content.decode()

    assert ("Missed schedule", "expire-leases") in lines
    assert ("Stalled work", "expire-leases") in lines
    assert ("Dead letters waiting", "expire-leases") in lines
    assert reverse("admin:cleanup_chunk_dead_letters") + "?policy=expire-leases" in page


def test_no_cluster_taking_work_is_said_first(admin_client):
    install_schedules()

    assert banner(admin_client)[0] == ("No worker cluster is taking work", None)
