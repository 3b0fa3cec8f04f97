"""A handler whose transaction ends under it (invariant 12): the server ends the session
it held idle past CLEANUP_IDLE_IN_TRANSACTION_TIMEOUT_MS, or the handler sends COMMIT
itself. ``cleanup_publish`` records the attempt as failed in a new transaction, its cause
named, delivers the rest of the batch and returns normally; the event is never marked
delivered outside the transaction of its handler's writes. A handler that returns with its
transaction marked for rollback is a failed attempt too: never delivered without its
writes.

transaction=True: the publisher's own transactions must really begin and end (a test
transaction around them would be the one the server ends), and the second connections
must see what the test committed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from io import StringIO

import psycopg
import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction

from cleanup.models import Event
from cleanup.outbox import emit, publish, registered
from cleanup.outbox.publisher import (
    CONNECTION_LOST,
    ENDED_BY_HANDLER,
    IDLE_PAST_BOUND,
    MARKED_FOR_ROLLBACK,
    STATEMENT_PAST_BOUND,
    backoff,
)
from tests.conftest import ROOT, database_url
from tests.engine_app.models import EventEffect
from tests.outbox_handlers import record_effect
from tests.pooler import env_through, started

pytestmark = pytest.mark.django_db(transaction=True)

IDLE_MS = 500


def emitted(name: str, key: str, ordering_key: str) -> Event:
    with transaction.atomic():
        assert emit(name, key, {"hold": key}, ordering_key=ordering_key)
    return Event.objects.get(name=name, key=key)


def a_batch(first: str) -> tuple[Event, Event, list[Event]]:
    """The event whose handler loses its transaction, first of the batch; one behind it
    on its ordering key; two events on other keys."""
    failing = emitted(first, "hold:1", "section:1")
    behind = emitted("seat.freed", "hold:2", "section:1")
    others = [emitted("seat.freed", f"hold:{n}", f"section:{n}") for n in (3, 4)]
    return failing, behind, others


def published(**handlers) -> dict:
    """Run ``cleanup_publish --json`` with ``handlers`` registered: returns normally."""
    out = StringIO()
    with registered(**{"seat.freed": record_effect, **handlers}):
        call_command("cleanup_publish", "--json", stdout=out)
    return json.loads(out.getvalue())


def failed_once(event: Event, cause: str) -> None:
    """The event is pending again after its first back-off, its attempt counted with
    ``cause``, its call record cleared."""
    event.refresh_from_db()
    assert (event.state, event.attempts, event.cause, event.call_started_at) == (
        "pending", 1, cause, None)
    assert event.available_at >= event.created_at + backoff(1)


def effects() -> list[str]:
    return sorted(EventEffect.objects.values_list("event_key", flat=True))


def sleep_past_the_idle_bound(event: Event) -> None:
    record_effect(event)
    time.sleep(IDLE_MS / 1000 * 3)


def test_a_handler_idle_past_its_bound_is_a_failed_attempt_and_the_batch_goes_on(settings):
    settings.CLEANUP_IDLE_IN_TRANSACTION_TIMEOUT_MS = IDLE_MS
    failing, behind, others = a_batch("slow")

    result = published(slow=sleep_past_the_idle_bound)

    assert result == {"delivered": 2, "failed": 1, "dead": 0, "skipped_busy": 0,
                      "handled": 3, "pending": 2}
    failed_once(failing, IDLE_PAST_BOUND.format(ms=IDLE_MS))
    assert "idle-in-transaction timeout" in failing.last_error
    # Its write rolled back with the session; the event behind it waits for its key.
    assert effects() == ["seat.freed/hold:3", "seat.freed/hold:4"]
    assert Event.objects.get(pk=behind.pk).state == "pending"


def wait_on_its_own_row(event: Event) -> None:
    """Wait, on a second connection, for the row its publisher's transaction holds: a
    wait nobody but the idle bound ends."""
    with psycopg.connect(database_url(), autocommit=True) as other:
        other.execute("SET statement_timeout = '20s'")
        other.execute("SELECT 1 FROM cleanup_event WHERE id = %s FOR UPDATE", [event.pk])


def test_a_handler_waiting_on_its_own_event_from_a_second_connection_is_a_failed_attempt(
        settings):
    settings.CLEANUP_IDLE_IN_TRANSACTION_TIMEOUT_MS = IDLE_MS
    failing, behind, others = a_batch("stuck")

    result = published(stuck=wait_on_its_own_row)

    assert (result["delivered"], result["failed"], result["dead"]) == (2, 1, 0)
    failed_once(failing, IDLE_PAST_BOUND.format(ms=IDLE_MS))
    assert effects() == ["seat.freed/hold:3", "seat.freed/hold:4"]


def terminated_mid_call(event: Event) -> None:
    """An operator's pg_terminate_backend ends the publisher's session mid-call."""
    record_effect(event)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    with psycopg.connect(database_url(), autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])


def test_a_handler_whose_session_is_terminated_is_a_failed_attempt():
    failing, behind, others = a_batch("cut")

    result = published(cut=terminated_mid_call)

    assert (result["delivered"], result["failed"], result["dead"]) == (2, 1, 0)
    failed_once(failing, CONNECTION_LOST.format(
        error="OperationalError: terminating connection due to administrator command"))
    assert effects() == ["seat.freed/hold:3", "seat.freed/hold:4"]


def commit_itself(event: Event) -> None:
    record_effect(event)
    with connection.cursor() as cursor:
        cursor.execute("COMMIT")


def record_effect_once(event: Event) -> None:
    """A handler that keys its write by the event's dedup id: a second call is a no-op."""
    EventEffect.objects.get_or_create(event_key=event.dedup_id,
                                      defaults={"event_id": event.pk})


def test_a_handler_that_commits_itself_is_a_failed_attempt_never_delivered(settings):
    failing, behind, others = a_batch("rogue")

    result = published(rogue=commit_itself)

    assert (result["delivered"], result["failed"], result["dead"]) == (2, 1, 0)
    failed_once(failing, ENDED_BY_HANDLER)
    # Its own COMMIT made its write stick without "delivered": the event is taken again.
    assert effects() == ["rogue/hold:1", "seat.freed/hold:3", "seat.freed/hold:4"]

    # The next attempt, after its back-off, is made harmless by the event's dedup key.
    with registered(rogue=record_effect_once, **{"seat.freed": record_effect}):
        assert publish(now=Event.objects.get(pk=failing.pk).available_at).delivered == 2
    assert Event.objects.get(pk=failing.pk).state == "delivered"
    assert effects() == ["rogue/hold:1", "seat.freed/hold:2", "seat.freed/hold:3",
                         "seat.freed/hold:4"]


def test_the_last_attempt_lost_is_dead_with_its_cause(settings):
    settings.CLEANUP_EVENT_MAX_ATTEMPTS = 1
    failing, behind, others = a_batch("rogue")

    result = published(rogue=commit_itself)

    assert (result["delivered"], result["failed"], result["dead"]) == (3, 0, 1)
    failing.refresh_from_db()
    assert (failing.state, failing.attempts, failing.cause) == ("dead", 1, ENDED_BY_HANDLER)
    assert Event.objects.get(pk=behind.pk).state == "delivered"


def test_a_handler_waiting_on_a_lock_past_the_statement_bound_is_a_failed_attempt(settings):
    settings.CLEANUP_STATEMENT_TIMEOUT_MS = 300
    blocker = EventEffect.objects.create(event_key="blocker", event_id=0)
    failing, behind, others = a_batch("blocked")

    def lock_the_blocker(event: Event) -> None:
        record_effect(event)
        EventEffect.objects.select_for_update().get(pk=blocker.pk)

    with psycopg.connect(database_url()) as holder:  # a transaction, left open
        holder.execute("SELECT 1 FROM engine_app_eventeffect WHERE id = %s FOR UPDATE",
                       [blocker.pk])
        result = published(blocked=lock_the_blocker)

    assert (result["delivered"], result["failed"], result["dead"]) == (2, 1, 0)
    failed_once(failing, STATEMENT_PAST_BOUND.format(ms=300))
    assert "canceling statement due to statement timeout" in failing.last_error
    assert effects() == ["blocker", "seat.freed/hold:3", "seat.freed/hold:4"]


def write_then_mark_for_rollback(event: Event) -> None:
    record_effect(event)
    transaction.set_rollback(True)


def write_then_swallow_a_database_error(event: Event) -> None:
    record_effect(event)
    try:
        with transaction.atomic(savepoint=False):
            record_effect(event)  # its key is taken: an IntegrityError, which marks
    except IntegrityError:  # the transaction for rollback, and is swallowed
        pass


@pytest.mark.parametrize("handler", [write_then_mark_for_rollback,
                                     write_then_swallow_a_database_error])
def test_a_handler_that_marks_its_transaction_for_rollback_is_a_failed_attempt_never_delivered(
        handler):
    """Invariant 12: "delivered" commits with the handler's writes, so never without
    them; the batch goes on and the command exits normally."""
    failing, behind, others = a_batch("quiet")

    result = published(quiet=handler)

    assert result == {"delivered": 2, "failed": 1, "dead": 0, "skipped_busy": 0,
                      "handled": 3, "pending": 2}
    failed_once(failing, MARKED_FOR_ROLLBACK)
    # Its write rolled back with its savepoint; the event behind it waits for its key.
    assert effects() == ["seat.freed/hold:3", "seat.freed/hold:4"]
    assert Event.objects.get(pk=behind.pk).state == "pending"


POOLED_PUBLISHER = """
import time
import django
django.setup()
from django.core.management import call_command
from cleanup.outbox import register_handler
from tests.outbox_handlers import record_effect

def sleep_past_the_idle_bound(event):
    record_effect(event)
    time.sleep(3)

register_handler("slow", sleep_past_the_idle_bound)
register_handler("seat.freed", record_effect)
call_command("cleanup_publish", "--json")
"""


@pytest.mark.pooler
def test_a_handler_idle_past_its_bound_behind_the_pooler_is_a_failed_attempt():
    """Behind PgBouncer in transaction mode the session ends the same way, and the
    command records the attempt on another server connection and goes on."""
    failing, behind, others = a_batch("slow")
    name = connection.settings_dict["NAME"]
    with started(pool_size=2) as pooler:
        env = env_through(pooler, name, DJANGO_SETTINGS_MODULE="tests.settings",
                          DATABASE_POOLER="transaction",
                          CLEANUP_IDLE_IN_TRANSACTION_TIMEOUT_MS="1000")
        process = subprocess.run([sys.executable, "-c", POOLED_PUBLISHER], cwd=ROOT,
                                 env=env, capture_output=True, text=True, timeout=120)
    assert process.returncode == 0, process.stdout + process.stderr
    result = json.loads(process.stdout)
    assert (result["delivered"], result["failed"], result["dead"]) == (2, 1, 0)
    failed_once(failing, IDLE_PAST_BOUND.format(ms=1000))
    assert effects() == ["seat.freed/hold:3", "seat.freed/hold:4"]
