"""One rule for a name registered twice (issue 44), for policies and outbox handlers
alike: the same one again is a no-op; a different one replaces it, without an exception
mid start-up, and system check cleanup.E043 names the two."""

from __future__ import annotations

from dataclasses import replace
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db.models import Q

from cleanup import policies
from cleanup.checks import check_registrations
from cleanup.exceptions import CleanupError
from cleanup.outbox import BadEvent, register_handler, registered
from cleanup.outbox.handlers import handler_for
from tests.outbox_handlers import record_effect


def another_handler(event) -> None:
    pass


def other_leases(cutoff) -> Q:
    return Q(state="gone")


def test_e043_the_apps_as_shipped_register_each_name_once():
    assert check_registrations() == []


def test_e043_a_second_handler_for_a_name_is_an_error_naming_both_callables():
    with registered():
        register_handler("seat.freed", record_effect)
        register_handler("seat.freed", record_effect)  # the same one again: nothing to say
        assert check_registrations() == []

        register_handler("seat.freed", another_handler)  # no exception, mid start-up or after

        (error,) = check_registrations()
        assert handler_for("seat.freed") is another_handler
    assert (error.id, error.msg) == (
        "cleanup.E043", "Event 'seat.freed' has two handlers: "
        "tests.outbox_handlers.record_effect, then "
        "tests.outbox.test_handler_registry.another_handler.")
    assert error.is_serious()
    assert check_registrations() == []  # the block put the registry back


def test_e043_a_second_policy_under_a_name_is_an_error_naming_both():
    shipped = policies.get_policy("expire-leases")
    with policies.registered():
        policies.register_policy(replace(shipped))  # an equal policy: nothing to say
        assert check_registrations() == []

        policies.register_policy(replace(shipped, eligible=other_leases))

        (error,) = check_registrations()
        assert policies.get_policy("expire-leases").eligible is other_leases
    assert error.msg == (
        "Policy 'expire-leases' is registered twice: tests.engine_app.policies."
        "expired_leases on engine_app.Lease, then tests.outbox.test_handler_registry.other_leases "
        "on engine_app.Lease.")
    assert policies.get_policy("expire-leases") is shipped


def test_e043_stops_manage_py_check_naming_both_handlers():
    with registered():
        register_handler("seat.freed", record_effect)
        register_handler("seat.freed", another_handler)
        with pytest.raises(SystemCheckError) as stopped:
            call_command("check", stdout=StringIO(), stderr=StringIO())
    assert "(cleanup.E043) Event 'seat.freed' has two handlers: " \
           "tests.outbox_handlers.record_effect, then " \
           "tests.outbox.test_handler_registry.another_handler." in str(stopped.value)
    call_command("check", stdout=StringIO(), stderr=StringIO())  # and passes once it is gone


def test_a_handler_must_be_callable_under_a_name_emit_would_take():
    with registered(), pytest.raises(BadEvent, match="event name holds a NUL character"):
        register_handler("seat\x00freed", record_effect)
    with registered(), pytest.raises(CleanupError, match="must be callable, not 'nope'"):
        register_handler("seat.freed", "nope")
