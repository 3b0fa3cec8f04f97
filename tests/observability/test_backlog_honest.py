"""A backlog figure that could not be read within its budget is never exported as 0.

Issue 33: while long transactions held VACUUM back, the count ran out of its 40 ms at
177 of 180 scrapes, and /metrics said 0 rows, age 0, over 7,070 reminder attempts
eligible for 30 days, so CleanupBacklogTooOld went pending and resolved again and again.
Here, on the engine app's lease logs (eligible 30 days on, as those attempts were), the
statements really are cancelled by the database: another connection holds the policy's
table locked, and the budget's statement_timeout ends the wait.
"""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from cleanup.engine.dispatch import dispatch
from cleanup.observability import backlog as backlog_module
from tests.conftest import database_url
from tests.engine_app.factories import LeaseFactory, LeaseLogFactory
from tests.engine_app.models import LeaseLog
from tests.observability.test_metrics import scrape, value

PURGE = {"policy": "purge-lease-logs"}
LEASES = {"policy": "expire-leases"}
THIRTY_DAYS = 30 * 24 * 3600


@pytest.fixture(autouse=True)
def _a_fresh_process(monkeypatch):
    """No slow read remembered from another test: a web process just started (the
    exact readings kept in the database go with each test's own)."""
    monkeypatch.setattr(backlog_module, "_over_budget", {})


@pytest.fixture
def stale_logs(account):
    """Five lease logs recorded 60 days ago: eligible for 30 days (retention 30)."""
    return LeaseLogFactory.create_batch(5, account=account, stale=True)


def lock_the_logs_table() -> psycopg.Connection:
    """Another connection holding the table, so that every read of it waits past the
    budget and is cancelled (QueryCanceled), as a read past VACUUM's leftovers is."""
    holder = psycopg.connect(database_url())
    holder.execute(f'LOCK TABLE "{LeaseLog._meta.db_table}" IN ACCESS EXCLUSIVE MODE')
    return holder


def backlog_samples(samples: dict, **labels) -> dict[str, float]:
    """The backlog gauges of one policy that the scrape has a sample for."""
    names = ("cleanup_eligible_rows", "cleanup_oldest_eligible_age_seconds",
             "cleanup_backlog_exact", "cleanup_backlog_reading_age_seconds")
    return {name: value(samples, name, **labels) for name in names
            if (name, frozenset(labels.items())) in samples}


@pytest.mark.django_db(transaction=True)  # the lock is taken from a second connection,
# which must see the logs committed and must not wait on the test's transaction
def test_a_count_past_the_budget_repeats_the_last_exact_reading_never_0(client, stale_logs):
    exact = backlog_samples(scrape(client), **PURGE)
    assert exact["cleanup_eligible_rows"] == 5
    assert exact["cleanup_backlog_exact"] == 1
    assert exact["cleanup_backlog_reading_age_seconds"] == 0
    assert exact["cleanup_oldest_eligible_age_seconds"] >= THIRTY_DAYS

    holder = lock_the_logs_table()
    try:
        repeated = backlog_samples(scrape(client), **PURGE)
    finally:
        holder.close()

    assert repeated["cleanup_backlog_exact"] == 0
    assert repeated["cleanup_eligible_rows"] == 5
    # The age the oldest row of that reading has now: it grew, it did not drop to 0.
    assert (exact["cleanup_oldest_eligible_age_seconds"]
            <= repeated["cleanup_oldest_eligible_age_seconds"]
            < exact["cleanup_oldest_eligible_age_seconds"] + 60)
    assert 0 < repeated["cleanup_backlog_reading_age_seconds"] < 60

    after = backlog_samples(scrape(client), **PURGE)  # the table free again
    assert (after["cleanup_backlog_exact"], after["cleanup_backlog_reading_age_seconds"]) == (1, 0)


@pytest.mark.django_db(transaction=True)  # the lock is taken from a second connection
def test_a_process_that_never_read_the_backlog_exports_no_sample_for_it(client, stale_logs):
    holder = lock_the_logs_table()
    try:
        samples = scrape(client)
    finally:
        holder.close()

    # No figure, only the marker: absent is what the alert rule rides over, 0 is not.
    assert backlog_samples(samples, **PURGE) == {"cleanup_backlog_exact": 0}
    # The other policies, on other tables, read as ever.
    assert backlog_samples(samples, **LEASES) == {
        "cleanup_eligible_rows": 0, "cleanup_oldest_eligible_age_seconds": 0,
        "cleanup_backlog_exact": 1, "cleanup_backlog_reading_age_seconds": 0}


@pytest.mark.django_db
def test_a_lower_bound_read_now_stands_over_a_smaller_exact_reading(client, account,
                                                                    monkeypatch):
    now = timezone.now()
    LeaseFactory.create_batch(2, account=account, expires_at=now - timedelta(hours=1))
    assert value(scrape(client), "cleanup_eligible_rows", **LEASES) == 2
    LeaseFactory.create_batch(3, account=account, expires_at=now - timedelta(hours=5))
    dispatch("expire-leases")  # its chunk, in flight, names all five

    def slow_count(rows, field, cap):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(2)")
    monkeypatch.setattr(backlog_module, "_count", slow_count)
    samples = backlog_samples(scrape(client), **LEASES)

    assert samples["cleanup_backlog_exact"] == 0
    assert samples["cleanup_eligible_rows"] == 5  # the chunk's five, not the reading's two
    assert 5 * 3600 <= samples["cleanup_oldest_eligible_age_seconds"] < 5 * 3600 + 60
    assert samples["cleanup_backlog_reading_age_seconds"] > 0  # that reading's, still


@pytest.mark.django_db(transaction=True)  # the lock is taken from a second connection
def test_past_the_budget_every_process_repeats_the_newest_exact_reading_any_took(
        client, stale_logs):
    """Two web workers behind one scrape address: one read five rows exactly ten minutes
    ago; the backlog was emptied, and the other read 0 just now. Past the budget, the
    scrape repeats the newest reading, whichever worker it reaches: no page for a
    backlog already gone."""
    key = f"policy:{PURGE['policy']}"
    oldest = min(log.recorded_at for log in stale_logs)
    earlier = backlog_module.Backlog(5, oldest, read_at=timezone.now() - timedelta(minutes=10))
    backlog_module._keep(key, earlier)
    LeaseLog.objects.all().delete()
    assert backlog_samples(scrape(client), **PURGE)["cleanup_eligible_rows"] == 0
    backlog_module._keep(key, earlier)  # the first worker's write lands late: not kept

    holder = lock_the_logs_table()
    try:
        repeated = backlog_samples(scrape(client), **PURGE)
    finally:
        holder.close()

    assert repeated["cleanup_backlog_exact"] == 0
    assert repeated["cleanup_eligible_rows"] == 0
    assert repeated["cleanup_oldest_eligible_age_seconds"] == 0
    assert repeated["cleanup_backlog_reading_age_seconds"] < 60
