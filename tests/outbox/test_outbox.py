"""The transactional outbox (invariant 12): an event is written in the transaction of
the change that caused it, and delivered once, in order per ordering key, with
"delivered" committed in the handler's own transaction."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.utils import timezone

from cleanup.models import Event
from cleanup.outbox import (
    BadEvent,
    OutsideTransaction,
    discard,
    emit,
    events,
    publish,
    register_handler,
    registered,
    requeue,
)
from cleanup.outbox.publisher import CANDIDATES, backoff
from tests.conftest import ROOT, subprocess_env, wait_for
from tests.engine_app.models import EventEffect
from tests.observability.test_metrics import scrape, value
from tests.outbox_handlers import record_effect

pytestmark = pytest.mark.django_db


class Crash(BaseException):
    """A process dying: nothing of the transaction it was in commits."""


def emitted(name="seat.freed", key="hold:1", payload=None, **options) -> Event:
    with transaction.atomic():
        assert emit(name, key, payload or {"hold": key}, **options)
    return Event.objects.get(name=name, key=key)


def states() -> dict[str, str]:
    return dict(Event.objects.values_list("key", "state"))


# emit


@pytest.mark.django_db(transaction=True)  # no test transaction: emit really is outside one
def test_emit_outside_a_transaction_is_refused_and_writes_nothing():
    with pytest.raises(OutsideTransaction, match=r"inside transaction\.atomic\(\)"):
        emit("seat.freed", "hold:1", {})
    assert Event.objects.count() == 0


def test_emit_twice_with_one_key_writes_one_event():
    with transaction.atomic():
        assert emit("seat.freed", "hold:1", {"n": 1}) is True
        assert emit("seat.freed", "hold:1", {"n": 2}) is False
    assert list(Event.objects.values_list("key", "payload")) == [("hold:1", {"n": 1})]


def test_one_key_under_two_names_is_two_events_neither_suppressing_the_other():
    emitted("seat.freed", "hold:1")
    emitted("hold.expired", "hold:1")
    assert Event.objects.count() == 2


def test_an_emit_whose_transaction_rolls_back_leaves_no_event():
    with pytest.raises(RuntimeError), transaction.atomic():
        emit("seat.freed", "hold:1", {})
        raise RuntimeError("the change failed")
    assert Event.objects.count() == 0


def test_an_event_says_where_it_came_from():
    run_id = "6f1c2d8e-0000-4000-8000-000000000001"
    from_run = emitted(key="hold:1", run_id=run_id, chunk_id=3, ordering_key="section:7")
    from_host = emitted(key="hold:2")
    assert (from_run.source, str(from_run.run_id), from_run.chunk_id) == (
        f"run {run_id} chunk 3", run_id, 3)
    assert (from_host.source, from_host.run_id, from_host.chunk_id) == ("host", None, None)
    assert (from_run.state, from_run.attempts) == ("pending", 0)


@pytest.mark.parametrize("args, error", [
    (("", "k", {}), "event name must be a non-empty string"),
    (("seat.freed", " ", {}), "event key must be a non-empty string"),
    (("seat.freed", "k" * 256, {}), "event key is 256 characters long; the limit is 255"),
    (("seat.freed", "k", {"blob": "x" * 9000}), "bytes; the limit is 8,192"),
    (("seat.freed", "k", {"obj": object()}), "payload of 'seat.freed' is not JSON"),
])
def test_an_event_that_cannot_be_stored_is_refused_by_name(args, error):
    with pytest.raises(BadEvent, match=error), transaction.atomic():
        emit(*args)
    assert Event.objects.count() == 0


# publish: order, transactions


def test_publish_delivers_every_event_in_id_order_per_ordering_key():
    seen = []
    for n in range(6):
        emitted(key=f"hold:{n}", ordering_key=f"section:{n % 2}")
    emitted(key="hold:unordered")
    with registered(**{"seat.freed": lambda event: seen.append(event.key)}):
        result = publish()
    assert (result.delivered, result.failed, result.dead) == (7, 0, 0)
    assert [k for k in seen if k in ("hold:0", "hold:2", "hold:4")] == ["hold:0", "hold:2",
                                                                         "hold:4"]
    assert [k for k in seen if k in ("hold:1", "hold:3", "hold:5")] == ["hold:1", "hold:3",
                                                                         "hold:5"]
    assert set(states().values()) == {"delivered"}
    assert not Event.objects.filter(delivered_at__isnull=True).exists()


def test_the_handler_gets_the_event_as_emitted():
    seen = []
    emitted(key="hold:9", payload={"hold": 9, "expires_at": "2026-12-03T10:00:00+00:00"},
            ordering_key="section:1")
    with registered(**{"seat.freed": seen.append}):
        publish()
    (event,) = seen
    assert (event.name, event.key, event.ordering_key, event.dedup_id) == (
        "seat.freed", "hold:9", "section:1", "seat.freed/hold:9")
    assert event.payload == {"hold": 9, "expires_at": "2026-12-03T10:00:00+00:00"}


def test_an_event_a_handler_emits_commits_with_the_delivery():
    emitted(key="hold:1", ordering_key="section:1")

    def offer_the_seat(event):
        emit("waitlist.offer", event.key, {"section": event.ordering_key},
             ordering_key=event.ordering_key)

    with registered(**{"seat.freed": offer_the_seat, "waitlist.offer": record_effect}):
        assert publish(batch=1).delivered == 1
        assert dict(Event.objects.values_list("name", "state")) == {
            "seat.freed": "delivered", "waitlist.offer": "pending"}
        assert publish().delivered == 1
    assert EventEffect.objects.get().event_key == "waitlist.offer/hold:1"


def test_a_crash_in_the_handler_leaves_neither_its_write_nor_delivered():
    event = emitted(ordering_key="section:1")
    t0 = timezone.now()

    def write_then_crash(event):
        record_effect(event)
        raise Crash

    with registered(**{"seat.freed": write_then_crash}), pytest.raises(Crash):
        publish(now=t0)
    assert EventEffect.objects.count() == 0
    event.refresh_from_db()
    # The call was recorded before the handler ran: nobody takes the event again before
    # the back-off the call would have had, had it failed.
    assert (event.state, event.attempts, event.call_started_at) == ("pending", 0, t0)
    assert event.available_at == t0 + backoff(1)

    with registered(**{"seat.freed": record_effect}):
        assert publish(now=t0 + backoff(1) - timedelta(seconds=0.1)).handled == 0
        assert publish(now=t0 + backoff(1)).delivered == 1
    assert list(EventEffect.objects.values_list("event_id", flat=True)) == [event.pk]
    event.refresh_from_db()
    # The call that never returned counts as a failed attempt, with its cause.
    assert (event.state, event.attempts, event.call_started_at) == ("delivered", 1, None)
    assert event.cause.startswith("its handler's call begun at ")
    assert event.cause.endswith("never returned: its publisher died or lost its connection")


def test_a_crash_after_marking_delivered_before_commit_leaves_neither():
    event = emitted()

    def crash_after_delivered(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if sql == events.DELIVER:
            raise Crash
        return result

    with registered(**{"seat.freed": record_effect}), pytest.raises(Crash), \
            connection.execute_wrapper(crash_after_delivered):
        publish()
    event.refresh_from_db()
    assert (event.state, EventEffect.objects.count()) == ("pending", 0)


KILLED_PUBLISHER = """
import django
django.setup()
from cleanup.outbox import publish, register_handler
from tests.outbox_handlers import record_effect_then_die
register_handler("seat.freed", record_effect_then_die)
publish()
"""


@pytest.mark.django_db(transaction=True)  # the subprocess must see the committed event
def test_a_publisher_killed_mid_handler_leaves_neither_and_the_event_is_taken_again():
    event = emitted(ordering_key="section:1")
    assert killed_publisher().returncode == -signal.SIGKILL

    event.refresh_from_db()
    assert (event.state, event.attempts, EventEffect.objects.count()) == ("pending", 0, 0)
    assert event.call_started_at is not None  # committed before the handler ran
    with registered(**{"seat.freed": record_effect}):
        assert publish(now=event.available_at).delivered == 1
    assert EventEffect.objects.get().event_id == event.pk
    event.refresh_from_db()
    assert (event.state, event.attempts) == ("delivered", 1)


def killed_publisher() -> subprocess.CompletedProcess:
    process = subprocess.run(
        [sys.executable, "-c", KILLED_PUBLISHER], cwd=ROOT,
        env=subprocess_env(),
        capture_output=True, text=True, timeout=60)
    assert process.returncode == -signal.SIGKILL, process.stdout + process.stderr
    return process


@pytest.mark.django_db(transaction=True)  # the subprocesses must see the committed event
def test_a_handler_that_kills_its_publisher_every_time_is_dead_after_its_attempts(settings):
    """Each call's record commits before the handler runs, so a handler that kills its
    process is counted like one that raises, and dead-lettered; its key goes on."""
    settings.CLEANUP_EVENT_MAX_ATTEMPTS = 3  # read by this process; the children's is 10
    event = emitted(ordering_key="section:1")
    behind = emitted(key="hold:2", ordering_key="section:1")
    for call in range(3):
        killed_publisher()
        # The back-off served at once, so the next publisher takes it now.
        Event.objects.filter(pk=event.pk).update(available_at=timezone.now())
        if call < 2:
            event.refresh_from_db()
            assert (event.state, event.attempts) == ("pending", call)
    with registered(**{"seat.freed": record_effect}):
        result = publish()
    event.refresh_from_db()
    # The third call never returned: with two before it, the attempts are used up.
    assert (event.state, event.attempts) == ("dead", 3)
    assert "never returned" in event.cause and event.settled_at is not None
    assert (result.dead, result.delivered) == (1, 1)
    assert list(EventEffect.objects.values_list("event_id", flat=True)) == [behind.pk]


FROZEN_PUBLISHER = KILLED_PUBLISHER.replace("record_effect_then_die",
                                            "record_effect_then_freeze")


@pytest.mark.django_db(transaction=True)  # the subprocess must see the committed event
def test_a_publisher_frozen_mid_handler_loses_its_session_and_the_event_is_taken_again():
    event = emitted(ordering_key="section:1")
    frozen = subprocess.Popen(
        [sys.executable, "-c", FROZEN_PUBLISHER], cwd=ROOT,
        env=subprocess_env(),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: _stopped(frozen.pid), timeout=30, what="the publisher to freeze")
        # The frozen process holds the event's row until its session is ended for it,
        # CLEANUP_IDLE_IN_TRANSACTION_TIMEOUT_MS (5 s) after its handler's write.
        with registered(**{"seat.freed": record_effect}):
            wait_for(lambda: publish().delivered == 1, timeout=30,
                     what="the event to be taken again")
    finally:
        frozen.kill()
        frozen.wait()
    event.refresh_from_db()
    assert event.state == "delivered"
    assert list(EventEffect.objects.values_list("event_id", "publisher")) == [
        (event.pk, "test")]  # the frozen one's write rolled back with its session


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


# publish: failures, back-off, dead letters


def fail(event):
    raise ValueError(f"mail server refused {event.key}")


def test_a_failing_event_is_retried_with_back_off_then_dead_and_holds_back_only_its_key(
        settings):
    settings.CLEANUP_EVENT_MAX_ATTEMPTS = 3
    settings.CLEANUP_EVENT_BACKOFF_SECONDS = 5
    settings.CLEANUP_EVENT_BACKOFF_MAX_SECONDS = 8
    failing = emitted("mail.offer", "hold:1", ordering_key="section:1")
    behind = emitted("seat.freed", "hold:2", ordering_key="section:1")
    other = emitted("seat.freed", "hold:3", ordering_key="section:2")
    t0 = timezone.now()

    with registered(**{"mail.offer": fail, "seat.freed": record_effect}):
        first = publish(now=t0)
        assert (first.delivered, first.failed, first.dead) == (1, 1, 0)
        assert states() == {"hold:1": "pending", "hold:2": "pending", "hold:3": "delivered"}
        failing.refresh_from_db()
        assert (failing.attempts, failing.available_at) == (1, t0 + timedelta(seconds=5))
        assert failing.cause == "ValueError: mail server refused hold:1"
        assert failing.last_error.startswith("Traceback (most recent call last)")

        assert publish(now=t0 + timedelta(seconds=4.9)).handled == 0  # not due; behind waits
        assert publish(now=t0 + timedelta(seconds=5)).failed == 1
        failing.refresh_from_db()  # 10 s, capped at 8
        assert (failing.attempts, failing.available_at) == (2, t0 + timedelta(seconds=13))

        last = publish(now=t0 + timedelta(seconds=13))
    # Dead: its key is released at once, and the event behind it delivered.
    assert (last.dead, last.delivered) == (1, 1)
    failing.refresh_from_db()
    assert (failing.state, failing.attempts) == ("dead", 3)
    assert failing.cause == "ValueError: mail server refused hold:1"
    assert states() == {"hold:1": "dead", "hold:2": "delivered", "hold:3": "delivered"}
    assert list(EventEffect.objects.order_by("id").values_list("event_id", flat=True)) == [
        other.pk, behind.pk]


def test_a_failing_unordered_event_holds_back_nothing():
    emitted("mail.offer", "hold:1")
    emitted("seat.freed", "hold:2")
    with registered(**{"mail.offer": fail, "seat.freed": record_effect}):
        result = publish()
    assert (result.delivered, result.failed) == (1, 1)


def test_a_failing_handler_leaves_none_of_its_writes():
    emitted()

    def write_then_fail(event):
        record_effect(event)
        raise ValueError("after the write")

    with registered(**{"seat.freed": write_then_fail}):
        assert publish().failed == 1
    assert EventEffect.objects.count() == 0


def test_the_back_off_doubles_up_to_its_cap(settings):
    settings.CLEANUP_EVENT_BACKOFF_SECONDS = 5
    settings.CLEANUP_EVENT_BACKOFF_MAX_SECONDS = 600
    assert [backoff(n).total_seconds() for n in (1, 2, 3, 7, 8, 1000)] == [
        5, 10, 20, 320, 600, 600]


def test_an_event_nobody_handles_is_dead_with_the_cause_never_delivered():
    event = emitted("seat.teleported", "hold:1", ordering_key="section:1")
    result = publish()
    assert (result.dead, result.delivered) == (1, 0)
    event.refresh_from_db()
    assert (event.state, event.cause) == ("dead", "no handler registered for seat.teleported")


def test_a_second_handler_for_one_name_replaces_it_and_the_decorator_registers():
    # Which one runs is then named by system check cleanup.E043
    # (tests/outbox/test_handler_registry.py).
    with registered():
        register_handler("seat.freed", record_effect)
        register_handler("seat.freed", record_effect)  # the same one again: a no-op
        register_handler("seat.freed", fail)

        @register_handler("seat.confirmed")
        def confirmed(event):
            pass

        from cleanup.outbox.handlers import handler_for
        assert (handler_for("seat.freed"), handler_for("seat.confirmed")) == (fail, confirmed)


# operator actions


def test_requeue_and_discard_change_dead_events_only_once():
    dead = emitted("seat.teleported", "hold:1")
    dead_too = emitted("seat.teleported", "hold:2")
    delivered = emitted("seat.freed", "hold:3")
    with registered(**{"seat.freed": record_effect}):
        publish()

    ids = [dead.pk, dead_too.pk, delivered.pk]
    first = requeue([dead.pk, delivered.pk])
    assert (first.done, first.skipped, first.affected) == (1, 1, (dead.pk,))
    assert requeue([dead.pk]).done == 0  # pending now: nothing to requeue
    dead.refresh_from_db()
    assert (dead.state, dead.attempts) == ("pending", 1)  # attempts kept

    gone = discard(ids, "teleportation was never a feature")
    assert (gone.done, gone.skipped, gone.affected) == (1, 2, (dead_too.pk,))
    assert discard(ids, "again").done == 0
    dead_too.refresh_from_db()
    assert (dead_too.state, dead_too.reason) == ("discarded",
                                                 "teleportation was never a feature")


def test_discard_needs_a_reason():
    dead = emitted("seat.teleported", "hold:1")
    publish()
    with pytest.raises(Exception, match="a reason is required to discard an event"):
        discard([dead.pk], "  ")
    dead.refresh_from_db()
    assert dead.state == "dead"


def test_a_requeued_event_is_delivered_once_its_handler_exists():
    event = emitted("seat.teleported", "hold:1")
    publish()
    requeue([event.pk])
    with registered(**{"seat.teleported": record_effect}):
        assert publish().delivered == 1
    event.refresh_from_db()
    assert event.state == "delivered"


# taking a batch does not read every pending event


@pytest.mark.parametrize("stuck", [False, True])
def test_taking_a_batch_reads_one_index_entry_per_ordering_key(stuck):
    """100,000 pending events over 50 keys: finding what may be taken reads each key's
    head, not the events behind it, even when every head is in back-off."""
    later = "now() + interval '1 hour'" if stuck else "now()"
    with connection.cursor() as cursor:
        cursor.execute(f"""
            INSERT INTO cleanup_event (name, "key", ordering_key, payload, state, attempts,
                available_at, created_at, last_error, cause, reason, source)
            SELECT 'seat.freed', 'hold:' || n, 'section:' || (n % 50), '{{}}', 'pending', 0,
                   CASE WHEN n <= 50 THEN {later} ELSE now() END, now(), '', '', '', 'host'
            FROM generate_series(1, 100000) AS n""")
        cursor.execute("ANALYZE cleanup_event")
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + CANDIDATES,
                       {"horizon": timezone.now() + timedelta(seconds=1), "limit": 100})
        plan = cursor.fetchone()[0][0]
    nodes = list(_nodes(plan["Plan"]))
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan"]
    read = sum((n["Actual Rows"] + n.get("Rows Removed by Filter", 0)) * n["Actual Loops"]
               for n in nodes if n["Node Type"] in ("Index Scan", "Index Only Scan"))
    assert read <= 200, read
    # Rows read, not time, pin the plan (about 1 ms here, the naive form 700 to 1,800).
    assert plan["Plan"]["Actual Rows"] == (0 if stuck else 50)


def _nodes(plan):
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


# the command


def test_the_command_says_what_it_delivered_and_what_is_left():
    emitted("seat.freed", "hold:1", ordering_key="section:1")
    emitted("seat.teleported", "hold:2", ordering_key="section:1")
    emitted("seat.freed", "hold:3", ordering_key="section:1")
    out = StringIO()
    with registered(**{"seat.freed": record_effect}):
        call_command("cleanup_publish", "--limit", "2", stdout=out)
    assert out.getvalue() == (
        "Handled 2 events: 1 delivered, 0 failed (taken again after a back-off), 1 "
        "dead-lettered; 0 skipped (held by another publisher). 1 event still pending (not "
        "due yet, or behind an earlier event of their ordering key).\n")

    out = StringIO()
    with registered(**{"seat.freed": record_effect}):
        call_command("cleanup_publish", "--json", stdout=out)
    assert json.loads(out.getvalue()) == {"delivered": 1, "failed": 0, "dead": 0,
                                          "skipped_busy": 0, "handled": 1, "pending": 0}
    out = StringIO()
    call_command("cleanup_publish", stdout=out)
    assert out.getvalue() == "No event was due.\n"


@pytest.mark.parametrize("limit", ["0", "x", "-1", "99999999999999999999"])
def test_the_command_refuses_a_bad_limit_and_changes_nothing(limit):
    emitted()
    with pytest.raises(CommandError) as refused:
        call_command("cleanup_publish", "--limit", limit)
    assert str(refused.value) == (f"Error: argument --limit: expected a whole number from 1 "
                                  f"to 2,147,483,647, not {limit!r}")
    assert states() == {"hold:1": "pending"}


def test_the_task_publishes_and_returns_the_counts():
    from cleanup.tasks import publish_events

    emitted()
    with registered(**{"seat.freed": record_effect}):
        assert publish_events() == {"delivered": 1, "failed": 0, "dead": 0,
                                    "skipped_busy": 0, "handled": 1}


def test_emitting_and_publishing_leave_nothing_on_the_session():
    """Invariant 11: behind a transaction pooler the publisher's connection is shared;
    no statement it sends outlives its transaction."""
    from tests.console.test_session_state import session_scoped

    sent = []

    def record(execute, sql, params, many, context):
        sent.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        emitted(key="hold:1", ordering_key="section:1")
        emitted("mail.offer", "hold:2")
        emitted("seat.teleported", "hold:3")
        with registered(**{"seat.freed": record_effect, "mail.offer": fail}):
            publish()
        requeue(Event.objects.filter(state="dead").values_list("pk", flat=True))
    assert len(sent) > 10
    assert [sql for sql in sent if session_scoped(sql)] == []


# /metrics

def test_metrics_count_pending_events_by_name_and_age_the_oldest(client):
    assert value(scrape(client), "cleanup_events_oldest_pending_age_seconds") == 0
    with transaction.atomic():
        emit("seat.freed", "hold:1", {"hold_id": 1}, ordering_key="section:1")
        emit("seat.freed", "hold:2", {"hold_id": 2}, ordering_key="section:1")
        emit("lease.ended", "lease:1", {})
    Event.objects.filter(key="hold:1").update(created_at=timezone.now() - timedelta(minutes=7))
    with registered(**{"lease.ended": record_effect, "seat.freed": fail}):
        publish()  # lease.ended delivered; seat.freed failed once, still pending

    samples = scrape(client)
    by_name = {dict(labels)["name"]: n for (metric, labels), n in samples.items()
               if metric == "cleanup_events_pending"}
    assert by_name == {"seat.freed": 2}  # lease.ended delivered: not pending
    assert 420 <= value(samples, "cleanup_events_oldest_pending_age_seconds") < 480
