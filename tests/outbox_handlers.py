"""Outbox handlers the tests register, in the test process and in the publishers they
start as subprocesses: each writes one EventEffect row keyed by the event, so a second
delivery of one event would fail on the unique key instead of counting twice."""

from __future__ import annotations

import os
import signal
import time

from cleanup.models import Event
from tests.engine_app.models import EventEffect


def record_effect(event: Event) -> None:
    EventEffect.objects.create(event_key=event.dedup_id, event_id=event.pk,
                               ordering_key=event.ordering_key,
                               publisher=os.environ.get("PUBLISHER", "test"))


def record_effect_then_die(event: Event) -> None:
    """Write the effect, then the process is killed before anything commits."""
    record_effect(event)
    os.kill(os.getpid(), signal.SIGKILL)


def record_effect_sometimes_slowly(event: Event) -> None:
    """One event in 97 takes 200 ms: long enough for another publisher to race ahead on
    that event's ordering key, were it allowed to."""
    if event.pk % 97 == 0:
        time.sleep(0.2)
    record_effect(event)


def record_effect_then_freeze(event: Event) -> None:
    """Write the effect, then the process freezes (SIGSTOP) holding the event's lock."""
    record_effect(event)
    os.kill(os.getpid(), signal.SIGSTOP)
