"""What outlives a deploy still works: django-q2 names task functions by dotted path in
queued messages and in schedules, so the paths the previous release stored must still
resolve after the engine's modules moved into subpackages."""

from __future__ import annotations

import pydoc
from multiprocessing import Queue, Value

import pytest
from django_q.brokers import get_broker
from django_q.signing import SignedPackage
from django_q.worker import worker

from cleanup.engine.dispatch import dispatch
from cleanup.engine.transport import CHUNK_TASK
from cleanup.models import Chunk
from cleanup.scheduling.schedules import DISPATCH_TASK, ENGINE_SCHEDULES

pytestmark = pytest.mark.django_db

# The task functions the previous release stored (its transport's CHUNK_TASK, its
# schedules' DISPATCH_TASK and ENGINE_SCHEDULES), as queue rows and Schedule rows hold them.
PREVIOUS_RELEASE = {
    "chunk": "cleanup.tasks.apply_chunk",
    "dispatch": "cleanup.tasks.dispatch_scheduled",
    "reconcile": "cleanup.tasks.reconcile_chunks",
    "heartbeat": "cleanup.tasks.heartbeat",
}


def test_every_path_the_previous_release_stored_still_names_a_task():
    for path in PREVIOUS_RELEASE.values():
        assert callable(pydoc.locate(path)), path
    # And this release stores the same ones (plus what it added).
    assert PREVIOUS_RELEASE["chunk"] == CHUNK_TASK
    assert PREVIOUS_RELEASE["dispatch"] == DISPATCH_TASK
    assert {ENGINE_SCHEDULES["reconcile"], ENGINE_SCHEDULES["heartbeat"]} == {
        PREVIOUS_RELEASE["reconcile"], PREVIOUS_RELEASE["heartbeat"]}


def test_a_chunk_message_queued_by_the_previous_release_runs_in_this_ones_worker(
        expired_leases):
    """Its queue row as the previous release wrote it (a signed package naming the task
    by path), taken off the ORM broker and run by django-q2's own worker loop."""
    run = dispatch("expire-leases").run
    broker = get_broker()
    for queued in broker.dequeue() or []:  # what this release queued: set aside
        broker.delete(queued[0])
    chunk = run.chunks.get()
    broker.enqueue(SignedPackage.dumps({
        "id": "previous-release", "name": "previous-release",
        "func": PREVIOUS_RELEASE["chunk"], "args": (chunk.message,), "kwargs": {},
        "group": str(run.id), "sync": True,  # sync: the worker keeps the test's connection
    }))
    ack, payload = broker.dequeue()[0][:2]
    tasks, results = Queue(), Queue()
    tasks.put(SignedPackage.loads(payload))
    tasks.put("STOP")

    worker(tasks, results, Value("f", -1), timeout=30)

    done = results.get(timeout=10)
    assert done["success"], done["result"]
    assert Chunk.objects.get(pk=chunk.pk).state == Chunk.State.COMMITTED
    assert done["result"] == "deleted"
    broker.delete(ack)
