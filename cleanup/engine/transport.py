"""The queue transport of chunk messages: send them, in the database transaction when
the broker shares it (django-q2's ORM broker), and send what was planned but unsent;
and django-q2's redelivery window, past which a chunk not finished counts as stalled."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from datetime import timedelta

from django.db import connections, transaction
from django.utils import timezone
from django_q.brokers import get_broker
from django_q.brokers.orm import ORM
from django_q.conf import Conf
from django_q.models import OrmQ
from django_q.tasks import async_task

from cleanup.conf import conf
from cleanup.engine import transitions
from cleanup.models import Chunk

CHUNK_TASK = "cleanup.tasks.apply_chunk"


def redelivery_window() -> timedelta:
    """How long a chunk may go without finishing before it counts as stalled: the
    broker's retry (its redelivery of an unacknowledged message) plus the task timeout."""
    return timedelta(seconds=conf.q_cluster.retry + (conf.q_cluster.timeout or 0))


def send(chunks: Iterable[Chunk], *, count: bool = True) -> int:
    """Enqueue the chunks' messages; inside a transaction they commit together with it.

    With the ORM broker the messages go in one INSERT: django-q2 still builds and signs
    each task, and only its row is held back (a round trip per message was most of
    the cost of writing a run). ``count`` False: the caller counts them on the run it
    holds locked (the window's planning does, in the run's one write).
    """
    broker = get_broker()
    batch = _HeldInserts(broker.list_key) if isinstance(broker, ORM) else broker
    per_run = Counter()
    for chunk in chunks:
        async_task(CHUNK_TASK, chunk.message, group=str(chunk.run_id), broker=batch)
        per_run[chunk.run_id] += 1
    if batch is not broker:
        batch.insert()
    if count:
        transitions.count_sent(per_run)
    return per_run.total()


class _HeldInserts(ORM):
    """django-q2's ORM broker, holding the queue rows it is given for one bulk INSERT."""

    def __init__(self, list_key: str):
        super().__init__(list_key=list_key)
        self.rows: list[OrmQ] = []

    def enqueue(self, task) -> str:
        # As ORM.enqueue writes it, in the same transaction when there is one.
        self.rows.append(OrmQ(key=self.list_key or Conf.CLUSTER_NAME, payload=task,
                              lock=timezone.now()))
        return "(held for one INSERT)"  # django-q2 logs it as the queue row's id

    def insert(self) -> None:
        # executemany, not bulk_create: Django's UNNEST bulk insert quotes each payload
        # in Python inside an array literal, seven times slower for items messages.
        with connections[self.get_connection().db].cursor() as cursor:
            cursor.executemany(
                f'INSERT INTO "{OrmQ._meta.db_table}" ("key", "payload", "lock") '
                "VALUES (%s, %s, %s)",
                [(row.key, row.payload, row.lock) for row in self.rows],
            )
        self.rows.clear()


def queue_shares_transaction() -> bool:
    """Whether enqueueing joins the database transaction (django-q2's ORM broker)."""
    return isinstance(get_broker(), ORM)


def send_planned(run_id) -> int:
    """Send a run's chunks that are planned but unsent, and mark them enqueued."""
    with transaction.atomic():
        chunks = list(
            Chunk.objects.select_for_update(skip_locked=True)
            .filter(run_id=run_id, state=Chunk.State.PLANNED)
            .order_by("chunk_id")
        )
        transitions.planned_to_enqueued([c.pk for c in chunks])
        return send(chunks)


def send_unfinished(run_id) -> int:
    """Send every unfinished chunk of a run its process handed over (or left behind):
    planned ones are marked enqueued; a retrying one keeps its state, its message now
    in the queue for the queue's own retries. Chunks a delivery holds are skipped (the
    reconciler covers them)."""
    with transaction.atomic():
        chunks = list(
            Chunk.objects.select_for_update(skip_locked=True)
            .filter(run_id=run_id, state__in=Chunk.UNFINISHED)
            .order_by("chunk_id")
        )
        transitions.planned_to_enqueued([c.pk for c in chunks if c.state == Chunk.State.PLANNED])
        return send(chunks)
