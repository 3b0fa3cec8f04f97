"""A chunk's WAL: kept where the server counts WAL for each session (PostgreSQL 18),
unknown (never 0) where it does not; cleanup/sql/wal_v1.sql.

CI runs this file on both: make test on the machine's PostgreSQL 15, .ci/matrix on the
embedded 18. Each test says which server it is about and is skipped on the other.

transaction=True where a chunk must really commit: a session's WAL counters are flushed
only as it goes idle out of a transaction, and the figure is read after the commit.
"""

from __future__ import annotations

import json
import re
import time

import psycopg
import pytest
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from cleanup.engine import transitions
from cleanup.engine.dispatch import dispatch
from cleanup.engine.worker import Outcome, apply_chunk
from cleanup.models import Chunk, Total
from cleanup.observability.counters import WAL_COUNTED_FROM
from tests.conftest import chunks_of, database_url
from tests.engine_app.factories import LeaseFactory
from tests.engine_app.models import Lease
from tests.observability.test_metrics import scrape

LEASES = 2_000


@pytest.fixture
def counted(db):
    if connection.pg_version < WAL_COUNTED_FROM:
        pytest.skip("PostgreSQL before 18 keeps no per-session WAL counters")


@pytest.fixture
def not_counted(db):
    if connection.pg_version >= WAL_COUNTED_FROM:
        pytest.skip("PostgreSQL 18 and later count WAL for each session")


def session_wal(other: psycopg.Connection, pid: int) -> int:
    """The WAL session ``pid`` has written, as last flushed, read from another session."""
    return int(other.execute("SELECT wal_bytes FROM pg_stat_get_backend_wal(%s)",
                             [pid]).fetchone()[0])


def flushed() -> None:
    """Have this session's counters flushed (as it goes idle after this statement)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")


@pytest.mark.django_db(transaction=True)
def test_a_committed_chunk_keeps_the_wal_its_transaction_wrote(counted, account):
    Lease.objects.bulk_create(LeaseFactory.build_batch(LEASES, account=account, expired=True))
    chunk = chunks_of(dispatch("expire-leases", scheme="range").run)[0]
    pid = connection.connection.info.backend_pid
    with psycopg.connect(database_url(), autocommit=True) as other:
        flushed()
        before = session_wal(other, pid)
        with CaptureQueriesContext(connection) as queries:
            assert apply_chunk(chunk.message) == Outcome.DELETED
        flushed()
        whole = session_wal(other, pid) - before  # the delivery's start and end besides

    chunk.refresh_from_db()
    assert chunk.rows_deleted >= 500
    # A heap record a row at least; and no more than the session wrote, less the
    # delivery's start and its own reading afterwards (their records, and a page image
    # each of the chunk's row and of the policy's totals at most).
    assert chunk.rows_deleted * 40 <= chunk.wal_bytes <= whole, (chunk.wal_bytes, whole)
    assert whole - chunk.wal_bytes < 4 * 8_192 + 4_000, (chunk.wal_bytes, whole)
    # One statement after the commit reads it: the only round trip it adds to a chunk.
    calls = [re.search(r"cleanup_\w+_v1", q["sql"]).group() for q in queries.captured_queries
             if q["sql"].startswith("SELECT")]
    assert calls[-1] == "cleanup_chunk_wal_v1" and calls.count("cleanup_chunk_wal_v1") == 1
    assert not queries.captured_queries[-1]["sql"].startswith(("DELETE", "UPDATE"))
    figures = Total.objects.get(family="policy", subject="expire-leases").figures
    assert (figures["wal_bytes"], figures["wal_chunks"]) == (chunk.wal_bytes, 1)


@pytest.mark.django_db(transaction=True)
def test_the_wal_figure_is_scraped_and_shown_on_the_chunk_page(counted, account,
                                                              admin_client):
    LeaseFactory.create_batch(5, account=account, expired=True)
    (chunk,) = chunks_of(dispatch("expire-leases").run)
    before = scrape(admin_client)
    apply_chunk(chunk.message)
    after = scrape(admin_client)

    chunk.refresh_from_db()
    labels = frozenset({"policy": "expire-leases"}.items())
    assert after["cleanup_chunk_wal_bytes_sum", labels] - before[
        "cleanup_chunk_wal_bytes_sum", labels] == chunk.wal_bytes > 0
    assert after["cleanup_chunk_wal_bytes_count", labels] - before[
        "cleanup_chunk_wal_bytes_count", labels] == 1
    page = admin_client.get(reverse("admin:cleanup_chunk_change", args=[chunk.pk]))
    assert f"({chunk.wal_bytes:,} bytes)" in page.content.decode()


@pytest.mark.django_db(transaction=True)
def test_a_figure_kept_stays_and_is_counted_once(counted, account):
    LeaseFactory.create_batch(5, account=account, expired=True)
    (chunk,) = chunks_of(dispatch("expire-leases").run)
    apply_chunk(chunk.message)
    chunk.refresh_from_db()
    kept = chunk.wal_bytes
    mark = json.dumps({"pid": connection.connection.info.backend_pid, "bytes": 0})

    transitions.record_wal(chunk, mark, mark, 1_000)  # a second reading, far larger

    chunk.refresh_from_db()
    assert chunk.wal_bytes == kept
    figures = Total.objects.get(family="policy", subject="expire-leases").figures
    assert (figures["wal_bytes"], figures["wal_chunks"]) == (kept, 1)


ME = "this session's pid"


@pytest.mark.parametrize("started, mark", [
    ({"pid": ME}, {"pid": 1, "bytes": 0}),  # not this session (nor any)
    ({"pid": 1}, {"pid": ME, "bytes": 0}),  # the start on another session (a pooler)
    ({"pid": ME}, {"pid": ME, "bytes": 10**30}),  # counters that went back (reset)
    ({"pid": ME}, {"pid": str(ME), "bytes": "0"}),  # a hand edit, hostile or broken
    ({"pid": ME}, {"bytes": 0}),
    (None, {"pid": ME, "bytes": 0}),
    ({"pid": ME}, None),
    ([], []),
])
@pytest.mark.django_db(transaction=True)
def test_a_reading_that_cannot_be_told_keeps_nothing(counted, account, started, mark):
    LeaseFactory.create_batch(2, account=account, expired=True)
    (chunk,) = chunks_of(dispatch("expire-leases").run)
    transitions.to_committed(chunk, deleted=0, retries=0, elapsed=0.01)
    me = connection.connection.info.backend_pid
    started, mark = ({key: me if value == ME else value for key, value in part.items()}
                     if isinstance(part, dict) else part for part in (started, mark))

    assert transitions.record_wal(chunk, json.dumps(started), json.dumps(mark), 1_000) is None

    chunk.refresh_from_db()
    assert chunk.wal_bytes is None
    assert "wal_chunks" not in Total.objects.get(family="policy",
                                                 subject="expire-leases").figures


@pytest.mark.django_db(transaction=True)
def test_a_transaction_on_another_session_than_its_start_keeps_no_figure(
        counted, account, monkeypatch):
    """Behind a transaction pooler the delivery's start and the chunk's transaction may
    run on two server connections, each of which served other clients in between: the
    figure would hold their WAL (measured: a median 3x the chunk's own, up to 28x, with
    six clients writing through PgBouncer). It is not kept, and no round trip is spent."""
    LeaseFactory.create_batch(3, account=account, expired=True)
    (chunk,) = chunks_of(dispatch("expire-leases").run)
    start = transitions.start_delivery

    def started_elsewhere(*args, **kwargs):
        started = start(*args, **kwargs)
        started[0].wal_mark = json.dumps({**json.loads(started[0].wal_mark), "pid": 1})
        return started

    monkeypatch.setattr(transitions, "start_delivery", started_elsewhere)
    with CaptureQueriesContext(connection) as queries:
        assert apply_chunk(chunk.message) == Outcome.DELETED

    assert not any("cleanup_chunk_wal_v1" in q["sql"] for q in queries.captured_queries)
    chunk.refresh_from_db()
    assert (chunk.rows_deleted, chunk.wal_bytes) == (3, None)


@pytest.mark.django_db(transaction=True)
def test_a_reading_from_another_session_keeps_nothing(counted, account):
    LeaseFactory.create_batch(2, account=account, expired=True)
    (chunk,) = chunks_of(dispatch("expire-leases").run)
    transitions.to_committed(chunk, deleted=0, retries=0, elapsed=0.01)
    with connection.cursor() as cursor:
        cursor.execute("SELECT cleanup_wal_mark_v1()")
        (mark,) = cursor.fetchone()
    with psycopg.connect(database_url(), autocommit=True) as other:
        assert other.execute("SELECT cleanup_chunk_wal_v1(%s, %s, %s, 100)",
                             [chunk.pk, mark, mark]).fetchone() == (None,)
        # ... where the session that marked reads it
    assert transitions.record_wal(chunk, mark, mark, 100) is not None


@pytest.mark.django_db(transaction=True)
def test_the_reading_waits_for_a_lock_at_most_its_bound(counted, account):
    LeaseFactory.create_batch(2, account=account, expired=True)
    (chunk,) = chunks_of(dispatch("expire-leases").run)
    transitions.to_committed(chunk, deleted=0, retries=0, elapsed=0.01)
    with connection.cursor() as cursor:
        cursor.execute("SELECT cleanup_wal_mark_v1()")
        (mark,) = cursor.fetchone()
    with psycopg.connect(database_url()) as other:
        other.execute("SELECT 1 FROM cleanup_chunk WHERE id = %s FOR UPDATE", [chunk.pk])
        started = time.monotonic()
        with pytest.raises(OperationalError, match="lock timeout"):
            transitions.record_wal(chunk, mark, mark, 200)
        assert time.monotonic() - started < 2


@pytest.mark.django_db(transaction=True)
def test_a_reading_that_fails_leaves_the_outcome_as_it_committed(counted, account,
                                                                monkeypatch, caplog):
    LeaseFactory.create_batch(3, account=account, expired=True)
    (chunk,) = chunks_of(dispatch("expire-leases").run)

    def broken(*args):
        raise OperationalError("the server closed the connection")

    monkeypatch.setattr(transitions, "record_wal", broken)
    assert apply_chunk(chunk.message) == Outcome.DELETED

    chunk.refresh_from_db()
    assert (chunk.state, chunk.rows_deleted, chunk.wal_bytes) == (Chunk.State.COMMITTED, 3, None)
    assert "chunk WAL not recorded" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_before_postgresql_18_the_figure_is_unknown_and_costs_no_statement(
        not_counted, account, admin_client):
    LeaseFactory.create_batch(3, account=account, expired=True)
    (chunk,) = chunks_of(dispatch("expire-leases").run)

    with CaptureQueriesContext(connection) as queries:
        assert apply_chunk(chunk.message) == Outcome.DELETED

    assert not any("cleanup_chunk_wal_v1" in q["sql"] for q in queries.captured_queries)
    chunk.refresh_from_db()
    assert chunk.wal_bytes is None
    samples = scrape(admin_client)
    assert not any(name.startswith("cleanup_chunk_wal_bytes") for name, _ in samples)
    page = admin_client.get(reverse("admin:cleanup_chunk_change", args=[chunk.pk]))
    assert "unknown on PostgreSQL &lt; 18" in page.content.decode()
    with connection.cursor() as cursor:
        mark = json.dumps({"pid": connection.connection.info.backend_pid, "bytes": 0})
        cursor.execute("SELECT cleanup_wal_mark_v1(), cleanup_chunk_wal_v1(%s, %s, %s, 100)",
                       [chunk.pk, mark, mark])
        assert cursor.fetchone() == (None, None)
