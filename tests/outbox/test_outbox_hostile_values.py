"""Hostile values sent to the outbox (issue 44) are refused by the engine's own error
before any SQL, naming what was wrong, and the host's transaction goes on untouched:
emit's strings, payload, run and chunk ids; an operator's reason and event ids; a
trigger's event name. An event's discard reason follows a pause's rule."""

from __future__ import annotations

import json

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from cleanup.checks import check_settings
from cleanup.engine.operations import pause_reason
from cleanup.exceptions import CleanupError
from cleanup.models import Event
from cleanup.outbox import BadEvent, discard, emit, requeue
from cleanup.outbox.triggers import events_on_delete
from tests.engine.test_checks import ids, setting_errors
from tests.engine_app.models import EventEffect, Lease
from tests.outbox.test_console_events import EventFactory, action

pytestmark = pytest.mark.django_db


def nested(levels: int) -> list:
    deep: list = []
    for _ in range(levels - 1):
        deep = [deep]
    return deep


cycle: dict = {}
cycle["self"] = cycle
INT_RANGE = "a whole number from -2147483648 to 2147483647"

HOSTILE = [
    pytest.param(("x", "k", {"v": "a\x00b"}), {},
                 "event payload of 'x' holds a NUL character (\\u0000)", id="NUL in a value"),
    pytest.param(("x", "k", {"a\x00b": 1}), {},
                 "event payload of 'x' holds a NUL character (\\u0000)", id="NUL in a key"),
    pytest.param(("x", "k", {"v": float("nan")}), {},
                 "payload of 'x' is not JSON: Out of range float values", id="NaN"),
    pytest.param(("x", "k", [float("inf")]), {},
                 "payload of 'x' is not JSON: Out of range float values", id="Infinity"),
    pytest.param(("x", "k", {float("-inf"): 1}), {},
                 "payload of 'x' is not JSON: Out of range float values", id="-Infinity key"),
    pytest.param(("x", "k", {"v": "a\ud800b"}), {},
                 "event payload of 'x' holds a lone surrogate '\\ud800'", id="lone surrogate"),
    pytest.param(("x", "k", {"\udc80": 1}), {},
                 "event payload of 'x' holds a lone surrogate '\\udc80'",
                 id="lone surrogate key"),
    pytest.param(("x\x00", "k"), {}, "event name holds a NUL character", id="NUL in a name"),
    pytest.param(("x", "k\x00"), {}, "event key holds a NUL character", id="NUL in a key"),
    pytest.param(("x", "k\ud800"), {}, "event key holds a lone surrogate '\\ud800'",
                 id="lone surrogate in a key"),
    pytest.param(("x", "k"), {"ordering_key": "account:\x00"},
                 "event ordering key holds a NUL character", id="NUL in an ordering key"),
    pytest.param(("x", "k"), {"source": "host\x00"}, "event source holds a NUL character",
                 id="NUL in a source"),
    pytest.param(("x", "k"), {"run_id": "not-a-uuid"},
                 "event run id must be a UUID, not 'not-a-uuid'", id="run id not a UUID"),
    pytest.param(("x", "k"), {"run_id": 42}, "event run id must be a UUID, not 42",
                 id="run id a number"),
    pytest.param(("x", "k"), {"chunk_id": 2**31},
                 f"event chunk id must be {INT_RANGE}, not 2147483648", id="chunk id too big"),
    pytest.param(("x", "k"), {"chunk_id": -2**31 - 1},
                 f"event chunk id must be {INT_RANGE}, not -2147483649",
                 id="chunk id too small"),
    pytest.param(("x", "k"), {"chunk_id": "3"}, f"event chunk id must be {INT_RANGE}, not '3'",
                 id="chunk id a string"),
    pytest.param(("x", "k"), {"chunk_id": True}, f"event chunk id must be {INT_RANGE}, not True",
                 id="chunk id a bool"),
    pytest.param(("x", "k", nested(100_000)), {},
                 "payload of 'x' is nested more than 32 deep (CLEANUP_EVENT_PAYLOAD_MAX_DEPTH)",
                 id="100,000 deep"),
    pytest.param(("x", "k", cycle), {},
                 "payload of 'x' is nested more than 32 deep", id="a cycle"),
    pytest.param(("x", "k", [0] * 1_000_000), {},
                 "payload of 'x' holds more than 8,192 values, so more than 8,192 bytes",
                 id="a million values"),
]


@pytest.mark.parametrize("args, options, refusal", HOSTILE)
def test_a_hostile_emit_is_refused_before_any_sql_and_the_host_transaction_goes_on(
        args, options, refusal):
    with transaction.atomic():
        EventEffect.objects.create(event_key="host:before", event_id=1)
        with CaptureQueriesContext(connection) as sent, pytest.raises(BadEvent) as refused:
            emit(*args, **options)
        EventEffect.objects.create(event_key="host:after", event_id=2)  # the host goes on

    assert refusal in str(refused.value)
    assert sent.captured_queries == []
    assert sorted(EventEffect.objects.values_list("event_key", flat=True)) == [
        "host:after", "host:before"]
    assert not Event.objects.exists()


def test_text_that_only_looks_like_a_nul_or_is_not_ascii_is_stored_as_given():
    payload = {"path": "C:\\u0000", "holder": "caf\u00e9 \U0001f600", "\u00e9": [1.5, None]}
    with transaction.atomic():
        assert emit("x", "k\u00e9", payload, run_id="6F1C2D8E-0000-4000-8000-000000000001",
                    chunk_id=2**31 - 1)
    event = Event.objects.get()
    assert (event.key, event.payload, str(event.run_id), event.chunk_id) == (
        "k\u00e9", payload, "6f1c2d8e-0000-4000-8000-000000000001", 2**31 - 1)


def test_payload_size_and_depth_follow_their_settings(settings):
    settings.CLEANUP_EVENT_PAYLOAD_MAX_DEPTH = 2
    settings.CLEANUP_EVENT_PAYLOAD_MAX_BYTES = len(json.dumps({"a": {"b": "x" * 10}}))
    with transaction.atomic():
        assert emit("x", "deep enough", {"a": {"b": "x" * 10}})
        with pytest.raises(BadEvent, match="payload of 'x' is nested more than 2 deep"):
            emit("x", "too deep", {"a": {"b": []}})
        with pytest.raises(BadEvent, match="payload of 'x' is 27 bytes; the limit is 26"):
            emit("x", "too big", {"a": {"b": "x" * 11}})
        # UTF-8 bytes, as stored: 2 bytes each, where their escapes would take 6.
        with pytest.raises(BadEvent, match="payload of 'x' is 36 bytes; the limit is 26"):
            emit("x", "too big in UTF-8", {"a": {"b": "\u00e9" * 10}})
    assert list(Event.objects.values_list("key", flat=True)) == ["deep enough"]


@pytest.mark.parametrize("value", [0, 1, 1_048_577, 8192.0, "8192", None])
def test_e041_event_payload_bytes_must_be_a_whole_number_from_2_to_a_mebibyte(settings, value):
    assert ids(setting_errors(settings, "EVENT_PAYLOAD_MAX_BYTES", value)) == ["cleanup.E041"]


@pytest.mark.parametrize("value", [0, 101, 32.0, "32", None])
def test_e042_event_payload_depth_must_be_a_whole_number_from_1_to_100(settings, value):
    assert ids(setting_errors(settings, "EVENT_PAYLOAD_MAX_DEPTH", value)) == ["cleanup.E042"]


def test_e041_and_e042_allow_their_bounds(settings):
    settings.CLEANUP_EVENT_PAYLOAD_MAX_BYTES = 2
    settings.CLEANUP_EVENT_PAYLOAD_MAX_DEPTH = 100
    assert check_settings() == []
    settings.CLEANUP_EVENT_PAYLOAD_MAX_BYTES = 1_048_576
    settings.CLEANUP_EVENT_PAYLOAD_MAX_DEPTH = 1
    assert check_settings() == []


# An operator's reason and event ids


def dead_event() -> Event:
    return EventFactory(dead=True, delivered_at=None)


def test_a_discard_reason_with_a_nul_is_refused_before_any_sql_and_changes_nothing():
    dead = dead_event()
    with transaction.atomic():
        with CaptureQueriesContext(connection) as sent, pytest.raises(CleanupError) as refused:
            discard([dead.pk], "a\x00b")
        EventEffect.objects.create(event_key="host:after", event_id=1)  # the host goes on

    assert str(refused.value) == ("an event's discard reason must be one line of printable "
                                  "text; it holds '\\x00'")
    assert sent.captured_queries == []
    assert EventEffect.objects.count() == 1
    dead.refresh_from_db()
    assert (dead.state, dead.reason) == ("dead", "")


@pytest.mark.parametrize("reason, refusal", [
    pytest.param("x" * 100_000, "reason is at most 500 characters (this one has 100,000): "
                 "the console, the status and the alerts show it whole", id="100 KB"),
    pytest.param("two\nlines", "reason must be one line of printable text; it holds '\\n'",
                 id="two lines"),
    pytest.param("a\x00b", "reason must be one line of printable text; it holds '\\x00'",
                 id="a NUL"),
    pytest.param("a\ud800b", "reason must be one line of printable text; it holds '\\ud800'",
                 id="a lone surrogate"),
    pytest.param(b"bytes", "reason must be text, not bytes", id="bytes"),
])
def test_an_event_discard_reason_follows_the_rule_of_a_pause_reason(reason, refusal):
    dead = dead_event()
    with pytest.raises(CleanupError) as paused:
        pause_reason(reason)
    with pytest.raises(CleanupError) as discarded:
        discard([dead.pk], reason)

    assert (str(paused.value), str(discarded.value)) == (
        f"a pause's {refusal}", f"an event's discard {refusal}")
    dead.refresh_from_db()
    assert dead.state == "dead"


def test_the_console_refuses_a_discard_reason_of_two_lines_and_discards_nothing(admin_client):
    dead = dead_event()
    page = action(admin_client, "discard_events", [dead.pk], post="yes",
                  reason="the learner left\nthe course")
    assert page.context["form"].errors["reason"] == [
        "a discard's reason must be one line of printable text; it holds '\\n'"]
    dead.refresh_from_db()
    assert (dead.state, dead.reason) == ("dead", "")


@pytest.mark.parametrize("move", [requeue, lambda ids: discard(ids, "obsolete")],
                         ids=["requeue", "discard"])
@pytest.mark.parametrize("wrong", ["1\x00", 2**63, 0, True, None])
def test_an_event_id_out_of_the_column_is_refused_before_any_sql(move, wrong):
    dead = dead_event()
    with transaction.atomic():
        with CaptureQueriesContext(connection) as sent, pytest.raises(CleanupError) as refused:
            move([dead.pk, wrong])
        EventEffect.objects.create(event_key="host:after", event_id=1)  # the host goes on

    assert str(refused.value) == (f"an event id is a whole number from 1 to "
                                  f"9223372036854775807, not {wrong!r}")
    assert sent.captured_queries == []
    dead.refresh_from_db()
    assert dead.state == "dead"


# A trigger's event name


@pytest.mark.parametrize("event, refusal", [
    ("lease\x00expired", "event name holds a NUL character"),
    ("lease\ud800expired", "event name holds a lone surrogate '\\ud800'"),
    ("", "event name must be a non-empty string"),
])
def test_a_trigger_for_an_event_name_emit_would_refuse_is_refused_as_it_is_built(
        event, refusal):
    with pytest.raises(BadEvent, match=refusal.replace("\\", "\\\\")):
        events_on_delete(Lease._meta.db_table, event, key="'lease:' || gone.id",
                         payload="'{}'::jsonb")
