"""A lease lasts no longer than its setting from its last renewal, whatever its row
says: a recheck lease whose expiry an operator set by hand to ``infinity`` or a year
ahead is no renewal's, so a halted policy's recheck is sent all the same."""

from __future__ import annotations

import pytest
from django.db import connection
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from cleanup.engine import window
from cleanup.models import Lease as WorkLease

pytestmark = pytest.mark.django_db

TABLE = WorkLease._meta.db_table
GONE = "gone-host:4242:dead0000"
FOR_EVER = ["'infinity'", "clock_timestamp() + interval '1 year'"]


def hand_edited_lease(name: str, expiry_sql: str) -> None:
    """The row a killed process left, its expiry then set by an operator's hand."""
    with connection.cursor() as cursor:
        cursor.execute(f'INSERT INTO "{TABLE}" (name, owner, taken_at, expires_at) '
                       f"VALUES (%s, %s, clock_timestamp() - interval '1 hour', {expiry_sql})",
                       [name, GONE])


@pytest.mark.parametrize("expiry_sql", FOR_EVER)
def test_a_recheck_lease_set_to_last_for_ever_does_not_hold_a_halted_policys_recheck_back(
        db, expiry_sql):
    hand_edited_lease("recheck:expire-leases", expiry_sql)

    window.recheck_later("expire-leases")

    assert [SignedPackage.loads(q.payload)["func"] for q in OrmQ.objects.all()] == [
        window.RECHECK_TASK]
