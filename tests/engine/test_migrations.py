"""Migrations that carry data: what an earlier release stored reads right after them."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("cleanup", "0009_run_eligible_at_dispatch")]
AFTER = [("cleanup", "0010_folded_chunks_and_ledger_indexes")]


def latest():
    """Every app at its newest migration, as the tests after this one expect."""
    executor = MigrationExecutor(connection)
    return executor.loader.graph.leaf_nodes()


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


@pytest.mark.django_db(transaction=True)
def test_counter_totals_rolled_up_under_the_old_key_names_keep_counting():
    old = migrate(BEFORE)
    total = old.get_model("cleanup", "LedgerTotal")
    total.objects.create(policy="expire-leases", key="noop", value=7)
    total.objects.create(policy="expire-leases", key="chunks_published", value=40)
    total.objects.create(policy="expire-leases", key="messages_sent", value=2)  # both
    try:
        new = migrate(AFTER).get_model("cleanup", "LedgerTotal")
        figures = dict(new.objects.values_list("key", "value"))
        assert figures == {"noop_deliveries": 7, "messages_sent": 42}
    finally:
        migrate(latest())  # which carries them into the totals (0022)
        connection.cursor().execute("DELETE FROM cleanup_total")


@pytest.mark.django_db(transaction=True)
def test_the_test_database_is_left_at_the_newest_migrations():
    executor = MigrationExecutor(connection)
    assert executor.migration_plan(latest()) == []
