"""Run a task as a django-q2 cluster would: signed onto the ORM broker's queue, taken
off it, and run in django-q2's own worker loop, which finds its function by the dotted
path stored with it (``pydoc.locate``)."""

from __future__ import annotations

from datetime import datetime
from multiprocessing import Queue, Value

from django_q.brokers import get_broker
from django_q.models import OrmQ
from django_q.signing import SignedPackage
from django_q.worker import worker


def queue(task: dict) -> int:
    """Put a recorded task on the ORM broker's queue as django-q2 stores it: signed and
    pickled, with the arguments and start as Python values again."""
    package = {**task, "args": tuple(task["args"]),
               "started": datetime.fromisoformat(task["started"])}
    return int(get_broker().enqueue(SignedPackage.dumps(package)))


def run_queued(queued_id: int) -> dict:
    """Take a queued task off the queue and run it in django-q2's worker loop; return it
    finished (``result``, ``success``), acknowledged."""
    task = SignedPackage.loads(OrmQ.objects.get(pk=queued_id).payload)
    # sync: the worker then keeps the test's connection (it would close one in a
    # transaction) and raises what the task raised.
    task["sync"] = True
    tasks, results = Queue(), Queue()
    tasks.put(task)
    tasks.put("STOP")
    worker(tasks, results, Value("f", -1), timeout=30)
    get_broker().acknowledge(queued_id)
    return results.get(timeout=10)


def as_django_q2_runs(task: dict) -> dict:
    return run_queued(queue(task))
