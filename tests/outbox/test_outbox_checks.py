"""One test per system check id of the outbox's settings (cleanup.E032 to E035), in the
style of tests/engine/test_checks.py, which also lists them in CHECKED_BY."""

from __future__ import annotations

import pytest
from django.core import checks

from cleanup.checks import check_settings
from tests.engine.test_checks import ids, setting_errors


@pytest.mark.parametrize("value", [0, -1, 1_001, 2.5, "10", True, None])
def test_e032_event_attempts_must_be_a_whole_number_from_1_to_1000(settings, value):
    assert ids(setting_errors(settings, "EVENT_MAX_ATTEMPTS", value)) == ["cleanup.E032"]


def test_e032_message_names_the_setting_its_value_and_what_to_set(settings):
    (error,) = setting_errors(settings, "EVENT_MAX_ATTEMPTS", 0)
    assert error.msg == ("CLEANUP_EVENT_MAX_ATTEMPTS is 0; it must be a whole number of "
                         "attempts from 1 to 1000.")
    assert error.hint == (
        "Set how many failed handler calls an outbox event may have before it is "
        "dead-lettered; its ordering key waits behind it until then. The default is 10.")
    assert isinstance(error, checks.Error)


@pytest.mark.parametrize("value", [1, 1_000])
def test_e032_one_attempt_or_a_thousand_is_allowed(settings, value):
    assert setting_errors(settings, "EVENT_MAX_ATTEMPTS", value) == []


@pytest.mark.parametrize("value", [0, -5, 86_401, float("nan"), float("inf"), "5", True])
def test_e033_event_backoff_must_be_seconds_above_0_and_at_most_a_day(settings, value):
    assert ids(setting_errors(settings, "EVENT_BACKOFF_SECONDS", value)) == ["cleanup.E033"]


@pytest.mark.parametrize("value", [0, 1e308, "600", None])
def test_e034_event_backoff_cap_must_be_seconds_above_0_and_at_most_a_day(settings, value):
    assert ids(setting_errors(settings, "EVENT_BACKOFF_MAX_SECONDS", value)) == [
        "cleanup.E034"]


def test_e033_and_e034_take_fractions_of_a_second(settings):
    settings.CLEANUP_EVENT_BACKOFF_SECONDS = 0.25
    settings.CLEANUP_EVENT_BACKOFF_MAX_SECONDS = 2.5
    assert check_settings() == []


@pytest.mark.parametrize("value", [0, 36_501, "7", 1.5, None, True])
def test_e035_event_retention_must_be_whole_days_within_a_century(settings, value):
    assert ids(setting_errors(settings, "EVENT_RETENTION_DAYS", value)) == ["cleanup.E035"]


def test_e035_message_says_what_is_purged(settings):
    (error,) = setting_errors(settings, "EVENT_RETENTION_DAYS", 0)
    assert error.msg == ("CLEANUP_EVENT_RETENTION_DAYS is 0; it must be a whole number of "
                         "days from 1 to 36500.")
    assert error.hint.startswith("Set how many days outbox events delivered or discarded "
                                 "are kept before the engine purges them.")
