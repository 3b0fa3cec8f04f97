"""The product's own admin lists answer while their table is locked ACCESS EXCLUSIVE by
another session (a migration, a maintenance script), as the engine's pages do: read
within the overview's budget, past it saying the rows were not read, never a page that
waits for the lock. Without a lock they list their rows as before."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
from django.contrib import admin
from django.contrib.messages import get_messages
from django.urls import reverse

from cleanup.console.base import LIST_BUDGET_MS
from reservations.models import SeatHold
from tests.console.test_pages_under_a_table_lock import timed
from tests.factories import SeatHoldFactory
from tests.observability.test_blockers import other_session

pytestmark = pytest.mark.django_db(transaction=True)  # the lock is another session's
HOLDS = reverse("admin:reservations_seathold_changelist")
# The one statement that meets the lock costs the budget; the rest is the page itself.
ANSWERS_WITHIN = LIST_BUDGET_MS / 1000 + 1.5
HELD_AT_MOST = "8s"


@contextmanager
def table_locked(model):
    """``model``'s table locked ACCESS EXCLUSIVE by another session. The server ends that
    session after HELD_AT_MOST idle, so a page that waits for the lock fails its timing
    rather than hang the suite."""
    other = other_session("schema-change")
    try:
        other.execute(f"SET idle_in_transaction_session_timeout = '{HELD_AT_MOST}'")
        other.execute(f'LOCK TABLE "{model._meta.db_table}" IN ACCESS EXCLUSIVE MODE')
        yield
    finally:
        other.close()


@pytest.fixture
def holds_locked(section):
    SeatHoldFactory.create_batch(3, section=section)
    with table_locked(SeatHold):
        yield


def test_the_seat_hold_list_answers_under_a_table_lock_saying_it_read_nothing(
        admin_client, holds_locked):
    page, took = timed(lambda: admin_client.get(HOLDS))

    assert page.status_code == 200 and took < ANSWERS_WITHIN, took
    assert list(page.context["cl"].result_list) == []
    assert [str(m) for m in get_messages(page.wsgi_request)] == [
        f"Seat holds not read within {LIST_BUDGET_MS:,} ms (is the table locked?): "
        "none are listed."]


@pytest.mark.parametrize("query", ["?status__exact=held", "?q=learner",
                                   "?expires_at__year=2026", "?expired=yes&o=-5"])
def test_a_filtered_seat_hold_list_answers_under_a_table_lock(admin_client, holds_locked,
                                                              query):
    page, took = timed(lambda: admin_client.get(HOLDS + query))
    assert page.status_code == 200 and took < ANSWERS_WITHIN, took


def test_the_seat_hold_list_lists_its_rows_when_nothing_holds_its_table(admin_client,
                                                                        section):
    SeatHoldFactory.create_batch(3, section=section)
    page = admin_client.get(HOLDS)

    assert page.status_code == 200 and page.context["cl"].result_count == 3
    assert list(get_messages(page.wsgi_request)) == []


@pytest.mark.parametrize("model", [model for model in admin.site._registry
                                   if model._meta.app_label == "reservations"],
                         ids=lambda model: model._meta.model_name)
def test_each_product_list_answers_under_a_lock_of_its_own_table(admin_client, model):
    with table_locked(model):
        page, took = timed(lambda: admin_client.get(reverse(
            f"admin:reservations_{model._meta.model_name}_changelist")))

    assert page.status_code == 200 and took < ANSWERS_WITHIN, took
    assert list(page.context["cl"].result_list) == []
