"""The backlog on /metrics: counted exactly up to a cap, read within a time budget, and
a lower bound (said so) when the index cannot be read in time."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from cleanup.engine.dispatch import dispatch
from cleanup.observability import backlog as backlog_module
from cleanup.observability.backlog import BUDGET_MS, Budget, backlogs
from cleanup.observability.overview import overview
from cleanup.policies import all_policies, get_policy
from tests.engine_app.factories import LeaseFactory
from tests.engine_app.models import Lease
from tests.observability.test_metrics import scrape, value

pytestmark = pytest.mark.django_db
LEASES = {"policy": "expire-leases"}


@pytest.fixture(autouse=True)
def _no_memory_of_slow_reads(monkeypatch):
    monkeypatch.setattr(backlog_module, "_over_budget", {})


@pytest.fixture
def leases_by_age(account):
    """Five expired leases, 1 to 5 hours ago, the oldest created last."""
    now = timezone.now()
    return [LeaseFactory(account=account, expires_at=now - timedelta(hours=hours))
            for hours in (1, 2, 3, 4, 5)]


def policies_on_leases() -> int:
    """How many policies read the lease table (each scrape reads it once per policy)."""
    return sum(policy.model is Lease for policy in all_policies())


def statements_on_leases(queries: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in queries.captured_queries
            if f'"{Lease._meta.db_table}"' in q["sql"]]


def slow_index_read(calls: list):
    """An index read that outlasts any budget (a run's dead rows to wade through)."""
    def read(rows, field):
        calls.append(field)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(2)")
    return read


def show_statement_timeout() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        return cursor.fetchone()[0]


def test_eligible_rows_are_counted_not_estimated_by_the_planner(client, account):
    LeaseFactory.create_batch(300, account=account, expired=True)
    with connection.cursor() as cursor:
        cursor.execute(f'ANALYZE "{Lease._meta.db_table}"')
    # The statistics still say 300 rows; 5 are left.
    Lease.objects.filter(pk__in=list(Lease.objects.values_list("pk", flat=True)[5:])
                            ).delete()

    samples = scrape(client)

    assert value(samples, "cleanup_eligible_rows", **LEASES) == 5
    assert value(samples, "cleanup_backlog_exact", **LEASES) == 1
    # The console's overview counts the same rows.
    assert {h.policy: h.eligible_rows for h in overview()}["expire-leases"] == 5


def test_counting_stops_at_the_cap_and_the_oldest_stays_exact(client, leases_by_age,
                                                              monkeypatch):
    monkeypatch.setattr(backlog_module, "COUNT_CAP", 3)

    samples = scrape(client)

    assert value(samples, "cleanup_eligible_rows", **LEASES) == 3  # at least 3
    assert value(samples, "cleanup_backlog_exact", **LEASES) == 1
    age = value(samples, "cleanup_oldest_eligible_age_seconds", **LEASES)
    assert 5 * 3600 <= age < 5 * 3600 + 30


def test_each_scrape_statement_on_a_policy_table_is_bounded(client, expired_leases):
    with CaptureQueriesContext(connection) as queries:
        scrape(client)
    on_leases = statements_on_leases(queries)

    # One statement per policy: the count up to the cap, with the oldest of the rows it
    # counted.
    assert len(on_leases) == policies_on_leases() > 1
    for statement in on_leases:
        assert statement.startswith("SELECT COUNT(*), CASE WHEN MIN(")
        # Newest first, from the live end of the index while a run deletes the oldest.
        assert statement.startswith('SELECT COUNT(*), CASE WHEN MIN("__col1") <')
        assert statement.endswith(f"ORDER BY 1 DESC LIMIT {backlog_module.COUNT_CAP}) subquery")
    # ... each under the budget, set locally in its own transaction before it.
    sql = [q["sql"] for q in queries.captured_queries]
    first = sql.index(on_leases[0])
    assert any(f"'{BUDGET_MS}ms'" in s and "statement_timeout" in s for s in sql[:first])
    assert show_statement_timeout() == "0"


def test_at_the_cap_the_oldest_comes_from_one_probe_of_the_index(client, leases_by_age,
                                                                monkeypatch):
    monkeypatch.setattr(backlog_module, "COUNT_CAP", 3)
    with CaptureQueriesContext(connection) as queries:
        scrape(client)
    on_leases = statements_on_leases(queries)

    # Per policy, the count at the cap, then the probe.
    assert len(on_leases) == 2 * policies_on_leases()
    assert all(count.startswith("SELECT COUNT(*)") for count in on_leases[::2])
    for probe in on_leases[1::2]:
        # MIN of the bare column (the index answers it), clamped outside.
        assert re.match(r'SELECT CASE WHEN MIN\("engine_app_lease"\."expires_at"\) <', probe)


def test_an_index_read_past_the_budget_takes_the_oldest_row_in_flight(
        client, leases_by_age, monkeypatch):
    monkeypatch.setattr(backlog_module, "COUNT_CAP", 3)
    dispatch("expire-leases")  # its chunk, in flight, names all five leases
    calls = []
    monkeypatch.setattr(backlog_module, "_oldest", slow_index_read(calls))
    limit = show_statement_timeout()

    samples = scrape(client)

    # Tried for each policy on the table, and cancelled after the budget.
    assert calls == ["expires_at"] * policies_on_leases()
    assert value(samples, "cleanup_backlog_exact", **LEASES) == 0
    assert value(samples, "cleanup_eligible_rows", **LEASES) == 3
    age = value(samples, "cleanup_oldest_eligible_age_seconds", **LEASES)
    assert 5 * 3600 <= age < 5 * 3600 + 30  # the oldest lease, named by the chunk
    assert show_statement_timeout() == limit  # the caller's, put back


def test_a_range_chunk_in_flight_bounds_the_oldest_as_well(client, leases_by_age,
                                                          monkeypatch):
    monkeypatch.setattr(backlog_module, "COUNT_CAP", 3)
    dispatch("expire-leases", scheme="range")  # one id range over the five leases
    monkeypatch.setattr(backlog_module, "_oldest", slow_index_read([]))

    samples = scrape(client)

    assert value(samples, "cleanup_backlog_exact", **LEASES) == 0
    age = value(samples, "cleanup_oldest_eligible_age_seconds", **LEASES)
    assert 5 * 3600 <= age < 5 * 3600 + 30


def test_without_chunks_in_flight_the_age_is_that_of_a_row_counted(leases_by_age,
                                                                   monkeypatch):
    monkeypatch.setattr(backlog_module, "COUNT_CAP", 3)
    monkeypatch.setattr(backlog_module, "_oldest", slow_index_read([]))
    now = timezone.now()

    found = backlogs([get_policy("expire-leases")], now, Budget())["expire-leases"]

    assert (found.rows, found.exact) == (3, False)
    expiries = Lease.objects.values_list("expires_at", flat=True)
    # A lower bound: some eligible row's own age, never older than the oldest.
    assert found.oldest_observed in set(expiries)
    assert found.oldest_observed >= min(expiries)


def test_a_process_does_not_retry_a_slow_index_at_every_scrape(client, leases_by_age,
                                                              monkeypatch):
    monkeypatch.setattr(backlog_module, "COUNT_CAP", 3)
    calls = []
    monkeypatch.setattr(backlog_module, "_oldest", slow_index_read(calls))
    scrape(client)
    scrape(client)
    assert calls == ["expires_at"] * policies_on_leases()  # once per policy, not per scrape

    monkeypatch.setattr(backlog_module, "RETRY_AFTER_SECONDS", 0)
    scrape(client)
    assert calls == ["expires_at"] * 2 * policies_on_leases()


def test_nothing_readable_within_the_budget_is_no_reading_not_a_zero(leases_by_age,
                                                                      monkeypatch):
    def slow_count(rows, field, cap):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(2)")
    monkeypatch.setattr(backlog_module, "_count", slow_count)
    found = backlogs([get_policy("expire-leases")], timezone.now(), Budget())

    assert found["expire-leases"] is None  # five leases are eligible: 0 would be a lie
    assert show_statement_timeout() == "0"


@pytest.mark.django_db(transaction=True)  # outside a transaction: no test transaction
# around the read, so what it sets would stay on the session if it were not local
def test_the_budget_never_outlives_its_statement_on_the_session():
    assert not connection.in_atomic_block
    with CaptureQueriesContext(connection) as queries:
        assert Budget(25).read(show_statement_timeout) == "25ms"
    assert show_statement_timeout() == "0"
    # Set for the transaction only: a pooled server connection is handed on without it.
    assert any("set_config('statement_timeout', %s, true)" in q["sql"] or
               "set_config('statement_timeout', '25ms', true)" in q["sql"]
               for q in queries.captured_queries)
