"""Several publishers at once (two hosts): every event delivered exactly once, and per
ordering key in id order.

transaction=True: the publishers are real processes with their own connections, which
must see the events the test committed; their handlers write a row whose key is the
event's, unique, so a second delivery would fail rather than count twice, and one event
in 97 takes 200 ms, so the other publisher would overtake it on its key if it could.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import defaultdict

import pytest
from django.db import connection, transaction
from django.db.models import Count

from cleanup.models import Event
from cleanup.outbox import emit, publish, registered
from tests.conftest import ROOT, subprocess_env
from tests.engine_app.models import EventEffect
from tests.outbox_handlers import record_effect

pytestmark = pytest.mark.django_db(transaction=True)

EVENTS, KEYS, PUBLISHERS = 2_000, 50, 2

PUBLISHER = """
import json, pathlib, sys, time
import django
django.setup()
from cleanup.models import Event
from cleanup.outbox import publish, register_handler
from tests.outbox_handlers import record_effect_sometimes_slowly
register_handler("seat.freed", record_effect_sometimes_slowly)
barrier, me, publishers = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
(barrier / me).touch()
while len(list(barrier.iterdir())) < publishers:  # start together
    time.sleep(0.01)
totals = {"delivered": 0, "failed": 0, "dead": 0, "skipped_busy": 0, "calls": 0}
started = time.monotonic()
while Event.objects.filter(state="pending").exists():
    result = publish(50).as_dict()
    totals["calls"] += 1
    for name in ("delivered", "failed", "dead", "skipped_busy"):
        totals[name] += result[name]
totals["seconds"] = round(time.monotonic() - started, 2)
print(json.dumps(totals))
"""


def emit_events() -> None:
    """2,000 events over 50 ordering keys, interleaved, as the product emits them."""
    with transaction.atomic():
        for n in range(1, EVENTS + 1):
            emit("seat.freed", f"hold:{n}", {"hold": n}, ordering_key=f"section:{n % KEYS}")


def test_two_publishers_deliver_every_event_once_and_in_order_per_key(tmp_path):
    emit_events()
    started = time.monotonic()
    processes = [
        subprocess.Popen([sys.executable, "-c", PUBLISHER, str(tmp_path), f"p{n}",
                          str(PUBLISHERS)], cwd=ROOT,
                         env=subprocess_env(PUBLISHER=f"p{n}"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for n in range(PUBLISHERS)
    ]
    outputs = [process.communicate(timeout=240) for process in processes]
    elapsed = time.monotonic() - started
    for process, (_, err) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, err
    totals = [json.loads(out) for out, _ in outputs]

    # Exactly once: every event delivered, one effect each (the key is unique).
    assert Event.objects.filter(state="delivered").count() == EVENTS
    assert EventEffect.objects.count() == EVENTS
    assert sum(t["delivered"] for t in totals) == EVENTS
    assert sum(t["failed"] + t["dead"] for t in totals) == 0
    # Both took part: the work was shared, not one publisher alone.
    by_publisher = dict(EventEffect.objects.values_list("publisher").annotate(n=Count("id"))
                        .values_list("publisher", "n"))
    assert set(by_publisher) == {f"p{n}" for n in range(PUBLISHERS)}, by_publisher

    # In order per key: effects (ids assigned as each handler ran) follow event ids.
    delivered = defaultdict(list)
    for ordering_key, event_id in EventEffect.objects.order_by("id").values_list(
            "ordering_key", "event_id"):
        delivered[ordering_key].append(event_id)
    assert len(delivered) == KEYS
    assert {key: ids for key, ids in delivered.items() if ids != sorted(ids)} == {}
    print(f"\n{EVENTS} events over {KEYS} keys, {PUBLISHERS} publishers: "
          f"{max(t['seconds'] for t in totals):.1f} s publishing ({elapsed:.1f} s with "
          f"start-up), split {by_publisher}, skipped busy "
          f"{[t['skipped_busy'] for t in totals]}")


def test_an_event_another_publisher_holds_is_skipped_and_holds_back_only_its_key():
    with transaction.atomic():
        emit("seat.freed", "hold:1", {}, ordering_key="section:1")
        emit("seat.freed", "hold:2", {}, ordering_key="section:1")
        emit("seat.freed", "hold:3", {}, ordering_key="section:2")
    held = Event.objects.get(key="hold:1")
    locked, release = threading.Event(), threading.Event()

    def another_publisher():  # its own thread, so its own connection
        try:
            with transaction.atomic():
                Event.objects.select_for_update().get(pk=held.pk)
                locked.set()
                release.wait(30)
        finally:
            connection.close()

    thread = threading.Thread(target=another_publisher)
    thread.start()
    try:
        assert locked.wait(30)
        with registered(**{"seat.freed": record_effect}):
            result = publish()
    finally:
        release.set()
        thread.join()
    assert (result.delivered, result.skipped_busy) == (1, 1)
    assert dict(Event.objects.values_list("key", "state")) == {
        "hold:1": "pending", "hold:2": "pending", "hold:3": "delivered"}
