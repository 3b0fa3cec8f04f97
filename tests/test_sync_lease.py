"""The --sync lease holds against the races around it: a taker proves the owner gone
under a lock the owner cannot take back meanwhile, the worker never drops the lease's
connection for its age, and the rows eligible at dispatch are recorded once.

transaction=True: the owner and the taker are two real sessions.
"""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection, transaction

from cleanup.engine import process_lock, transitions
from cleanup.engine.dispatch import dispatch
from cleanup.engine.worker import _reset_broken_connection
from tests.conftest import database_url, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def other_session() -> psycopg.Connection:
    return psycopg.connect(database_url(), autocommit=True)


def test_a_taker_cannot_prove_a_live_owner_gone(expired_leases):
    run = dispatch("expire-leases").run
    owner = other_session()
    assert owner.execute("SELECT pg_try_advisory_lock(%s)",
                         [process_lock.key(run.pk)]).fetchone()[0]

    with transaction.atomic():
        assert not process_lock.absent_in_transaction(run.pk)
    owner.close()  # the server releases its locks as the session ends, a moment later

    def proven_absent() -> bool:
        with transaction.atomic():
            return process_lock.absent_in_transaction(run.pk)

    wait_for(proven_absent, timeout=10, what="the owner's session to end")


def test_the_owner_cannot_take_its_lease_back_while_a_takeover_commits(expired_leases):
    run = dispatch("expire-leases").run
    owner = other_session()

    with transaction.atomic():
        assert process_lock.absent_in_transaction(run.pk)
        # The owner reconnected and tries for its lease in the middle of the takeover.
        assert not owner.execute("SELECT pg_try_advisory_lock(%s)",
                                 [process_lock.key(run.pk)]).fetchone()[0]
    assert owner.execute("SELECT pg_try_advisory_lock(%s)",
                         [process_lock.key(run.pk)]).fetchone()[0]
    owner.close()


def test_a_retry_never_closes_the_leased_connection_for_its_age(expired_leases):
    run = dispatch("expire-leases").run
    assert process_lock.acquire(run.pk)
    try:
        connection.close_at = 0  # obsolete: CONN_MAX_AGE would close it now
        _reset_broken_connection()
        assert process_lock.held_here(run.pk)
    finally:
        process_lock.release(run.pk)
    assert not process_lock.leased_here()


def test_the_rows_eligible_at_dispatch_are_recorded_once(expired_leases):
    run = dispatch("expire-leases").run
    run.refresh_from_db()
    assert run.eligible_at_dispatch == 5

    assert not transitions.record_eligible(run.pk, 99)
    run.refresh_from_db()
    assert run.eligible_at_dispatch == 5
