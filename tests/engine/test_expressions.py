"""The engine's SQL building blocks send values PostgreSQL reads back unchanged."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import connection

from cleanup.expressions import ObservedText, array_literal
from tests.engine_app.factories import LeaseFactory
from tests.engine_app.models import Lease

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("values", [
    [1, 2, 9_000_000_000],
    ["plain", 'with "quotes"', "back\\slash", "comma, brace}{", "", "NULL"],
])
def test_array_literal_elements_round_trip_through_postgresql(values):
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::text[]", [array_literal(values)])
        assert cursor.fetchone()[0] == [str(v) for v in values]


def test_array_literal_sends_none_as_null():
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::bigint[]", [array_literal([1, None])])
        assert cursor.fetchone()[0] == [1, None]


@pytest.mark.parametrize("moment", [
    datetime(2026, 11, 29, 23, 22, 51, 315630, tzinfo=UTC),
    datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),  # no microseconds
])
def test_iso_timestamp_text_parses_back_to_the_stored_instant(account, moment):
    lease = LeaseFactory(account=account, expires_at=moment)
    (text,) = Lease.objects.filter(pk=lease.pk).values_list(
        ObservedText("expires_at"), flat=True)
    assert datetime.fromisoformat(text) == moment
    assert Lease.objects.filter(pk=lease.pk, expires_at=text).exists()
