"""A chunk's commit waits for its WAL flush only where the acknowledgement would not
prove it durable (docs/design.md, *A chunk's commit and its flush*): a queue's delivery
with django-q2's ORM broker commits with synchronous_commit off; with the Redis broker,
and in a --sync run, the chunk keeps the server's setting. A delivery's start, a trace
that any later commit's flush makes durable, never waits for it (*A delivery's start*);
a message naming no chunk is kept with the server's setting."""

from __future__ import annotations

import pytest
from django.db import connection

from cleanup import faults
from cleanup.engine.dispatch import dispatch, dispatch_in_process
from cleanup.engine.worker import apply_chunk
from cleanup.models import OrphanMessage
from tests.engine.test_reliability import redis_broker  # noqa: F401 - a fixture
from tests.engine_app.factories import LeaseFactory

pytestmark = pytest.mark.django_db(transaction=True)  # each chunk commits for real


def flush_settings(apply) -> list[str]:
    """``synchronous_commit`` inside each chunk transaction ``apply`` runs."""
    seen = []

    def read() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('synchronous_commit')")
            seen.append(cursor.fetchone()[0])

    with faults.injected(faults.BEFORE_COMMIT, read):
        apply()
    return seen


def settings_after(marker: str, apply) -> list[str]:
    """``synchronous_commit`` right after each statement whose SQL holds ``marker``, in
    its transaction."""
    seen, reading = [], []

    def wrapper(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if marker in sql and not reading:
            reading.append(True)
            try:
                seen.append(session_setting())
            finally:
                reading.clear()
        return result

    with connection.execute_wrapper(wrapper):
        apply()
    return seen


def session_setting() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('synchronous_commit')")
        return cursor.fetchone()[0]


def test_a_queue_delivery_with_the_orm_broker_commits_without_waiting_for_its_flush(account):
    LeaseFactory.create_batch(3, account=account, expired=True)
    chunks = list(dispatch("expire-leases").run.chunks.all())

    seen = flush_settings(lambda: [apply_chunk(chunk.message) for chunk in chunks])

    assert seen == ["off"] * len(chunks)
    assert session_setting() == "on"  # for the transaction alone


def test_with_the_redis_broker_a_chunk_waits_for_its_flush(redis_broker, account):  # noqa: F811
    LeaseFactory.create_batch(3, account=account, expired=True)
    chunks = list(dispatch("expire-leases").run.chunks.all())

    seen = flush_settings(lambda: [apply_chunk(chunk.message) for chunk in chunks])

    assert seen == ["on"] * len(chunks)


def test_a_sync_run_keeps_the_servers_setting(account):
    LeaseFactory.create_batch(3, account=account, expired=True)
    with connection.cursor() as cursor:  # a server set stronger than the default
        cursor.execute("SELECT set_config('synchronous_commit', 'remote_apply', false)")
    try:
        seen = flush_settings(lambda: dispatch_in_process("expire-leases"))
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('synchronous_commit', 'on', false)")

    assert seen and set(seen) == {"remote_apply"}


def settings_at_each_start(apply) -> list[str]:
    """``synchronous_commit`` in the transaction of each delivery's start, as the
    database sees it when the start counts the delivery (a statement of its own: the
    setting is gone once it returns)."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE test_seen_setting (id serial, setting text)")
        cursor.execute(
            "CREATE FUNCTION test_see_setting() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN INSERT INTO test_seen_setting (setting) "
            "VALUES (current_setting('synchronous_commit')); RETURN NEW; END $$")
        cursor.execute(
            "CREATE TRIGGER test_see_setting AFTER UPDATE ON cleanup_chunk FOR EACH ROW "
            "WHEN (OLD.deliveries <> NEW.deliveries) EXECUTE FUNCTION test_see_setting()")
    try:
        apply()
        with connection.cursor() as cursor:
            cursor.execute("SELECT setting FROM test_seen_setting ORDER BY id")
            return [setting for (setting,) in cursor.fetchall()]
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER test_see_setting ON cleanup_chunk; "
                           "DROP FUNCTION test_see_setting(); DROP TABLE test_seen_setting")


@pytest.mark.parametrize("broker", ["orm", "redis"])
def test_a_deliverys_start_never_waits_for_its_flush(request, broker, account):
    if broker == "redis":
        request.getfixturevalue("redis_broker")
    LeaseFactory.create_batch(3, account=account, expired=True)
    chunks = list(dispatch("expire-leases").run.chunks.all())

    seen = settings_at_each_start(lambda: [apply_chunk(c.message) for c in chunks])

    assert seen == ["off"] * len(chunks)
    assert session_setting() == "on"


def test_a_message_naming_no_chunk_is_kept_with_the_servers_setting(account):
    LeaseFactory.create_batch(3, account=account, expired=True)
    chunk = dispatch("expire-leases").run.chunks.first()
    message = dict(chunk.message, chunk_id=999)
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('synchronous_commit', 'remote_apply', false)")
    try:
        seen = settings_after(OrphanMessage._meta.db_table, lambda: apply_chunk(message))
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('synchronous_commit', 'on', false)")

    assert seen == ["remote_apply"]
    assert OrphanMessage.objects.get().chunk_id == 999
