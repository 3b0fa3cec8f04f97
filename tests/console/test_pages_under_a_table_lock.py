"""The pages and commands an operator opens to see why work waits answer while a
policy's table is locked ACCESS EXCLUSIVE by another session (a migration, a
maintenance script): a backlog they cannot count in time is unknown, never 0, and
never a page that hangs."""

from __future__ import annotations

import json
import time
from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse

from cleanup.engine.dispatch import dispatch
from cleanup.observability.overview import BACKLOG_BUDGET_MS
from tests.engine_app.factories import LeaseFactory
from tests.observability.test_blockers import LEASES, other_session

pytestmark = pytest.mark.django_db(transaction=True)  # the lock is another session's
# Each locked policy costs its budget once; the rest is the page itself.
ANSWERS_WITHIN = 2 * BACKLOG_BUDGET_MS / 1000 + 1.5


@pytest.fixture
def table_locked():
    LeaseFactory.create_batch(5, expired=True)
    run = dispatch("expire-leases").run
    with other_session("schema-change") as other:
        other.execute(f'LOCK TABLE "{LEASES}" IN ACCESS EXCLUSIVE MODE')
        yield run
        other.rollback()


def timed(call):
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


def test_the_overview_answers_and_says_the_backlog_is_unknown(admin_client, table_locked):
    page, took = timed(lambda: admin_client.get(
        reverse("admin:cleanup_cleanupoverview_changelist")))
    text = page.content.decode()

    assert page.status_code == 200 and took < ANSWERS_WITHIN, took
    assert "Backlog unknown" in text
    assert f"not counted within {BACKLOG_BUDGET_MS:,} ms" in text
    assert reverse("admin:cleanup_policy_blockers", args=["expire-leases"]) in text


@pytest.mark.parametrize("name", ["admin:cleanup_run_change", "admin:cleanup_chunk_change"])
def test_the_run_and_chunk_pages_answer(admin_client, table_locked, name):
    target = table_locked if name.endswith("run_change") else table_locked.chunks.get()
    page, took = timed(lambda: admin_client.get(reverse(name, args=[target.pk])))
    assert page.status_code == 200 and took < ANSWERS_WITHIN, took


def test_cleanup_policies_says_unknown_not_none(table_locked):
    out = StringIO()
    _, took = timed(lambda: call_command("cleanup_policies", stdout=out))
    as_json = StringIO()
    call_command("cleanup_policies", "--json", stdout=as_json)
    [leases] = [p for p in json.loads(as_json.getvalue())["policies"]
                if p["policy"] == "expire-leases"]

    assert took < ANSWERS_WITHIN, took
    assert (f"backlog   unknown: not counted within {BACKLOG_BUDGET_MS:,} ms (is its table "
            "locked?)") in out.getvalue()
    assert leases["backlog"]["eligible_rows"] is None
