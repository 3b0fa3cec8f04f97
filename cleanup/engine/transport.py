"""The queue transport of chunk messages: send them, in the database transaction when
the broker shares it (django-q2's ORM broker), and send what was planned but unsent;
django-q2's redelivery window, past which a chunk not finished counts as stalled; and
the messages a process applying a run itself (``--sync``) takes from the queue.

A process that applies a run takes its messages as a worker's dequeue would: with the
ORM broker they are written already taken, their ``lock`` ``CLEANUP_SYNC_CLAIM_SECONDS``
ahead, and the process deletes each once its chunk committed. If it dies or freezes,
the broker hands them to the workers once that lapses, like any worker's. Under
django-q2's sync mode there is no queue to take from: the process applies them and
nothing is sent (any other run's chunks are applied once their transaction commits,
one after another). Another broker (Redis) cannot hold a message back: it is sent, and a
worker that takes it before the process finds the chunk finished (a no-op)."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import timedelta

from django.db import connections, transaction
from django.db.models import Q
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


# The runs this process applies itself (``--sync``), each with the queue rows it took
# for its chunks (chunk pk -> the OrmQ row's id and the lock it was written with).
_taken: dict = {}


@contextmanager
def applying_here(run_id) -> Iterator[dict]:
    """While the block runs, this process applies the run: the messages sent for its
    chunks are taken for it (returned: chunk pk -> queue row). Those it has not
    finished when the block ends go back to the queue at once."""
    taken = _taken.setdefault(run_id, {})
    try:
        yield taken
    finally:
        del _taken[run_id]
        _give_back(list(taken.values()))


def _give_back(rows: list) -> None:
    """Make the taken queue rows deliverable to the workers now; one a worker took
    meanwhile (its claim lapsed: the lock is the worker's now) stays the worker's."""
    if rows:
        still_ours = Q()
        for pk, lock in rows:
            still_ours |= Q(pk=pk, lock=lock)
        OrmQ.objects.using(Conf.ORM).filter(still_ours).update(lock=timezone.now())


def finished_here(taken: dict, chunk_pk) -> None:
    """Acknowledge the message of a chunk this process finished: its queue row goes,
    as a worker's acknowledgement deletes it."""
    if (row := taken.pop(chunk_pk, None)) is not None:
        OrmQ.objects.using(Conf.ORM).filter(pk=row[0]).delete()


def send(chunks: Iterable[Chunk], *, count: bool = True) -> int:
    """Enqueue the chunks' messages; inside a transaction they commit together with it.

    With the ORM broker the messages go in one INSERT: django-q2 still builds and signs
    each task, and only its row is held back (a round trip per message was most of
    the cost of writing a run). ``count`` False: the caller counts them on the run it
    holds locked (the window's planning does, in the run's one write).
    """
    broker = get_broker()
    batch = _HeldInserts(broker.list_key) if isinstance(broker, ORM) else broker
    per_run, inline = Counter(), []
    for chunk in chunks:
        if Conf.SYNC:
            if chunk.run_id not in _taken:  # a run applied here needs no other process
                inline.append((chunk.message, str(chunk.run_id)))
                per_run[chunk.run_id] += 1
            continue
        per_run[chunk.run_id] += 1
        async_task(CHUNK_TASK, chunk.message, group=str(chunk.run_id), broker=batch)
        if batch is not broker and chunk.run_id in _taken:
            batch.take_last(_taken[chunk.run_id], chunk.pk)
    if batch is not broker:
        batch.insert()
    if inline:
        transaction.on_commit(lambda: _apply_inline(inline))
    if count:
        transitions.count_sent(per_run)
    return per_run.total()


# django-q2's sync mode runs a task where it is sent: a chunk's would run inside the
# transaction that planned it, before its run commits, and the chunk it plans inside
# that one. Its messages are run once the sending transaction has committed instead,
# one after another (the messages they send join the line, never nested).
_inline: deque | None = None


def _apply_inline(messages: list) -> None:
    global _inline
    if _inline is not None:  # a chunk applied inline sent these: they wait their turn
        _inline.extend(messages)
        return
    _inline = deque(messages)
    try:
        while _inline:
            message, group = _inline.popleft()
            async_task(CHUNK_TASK, message, group=group, sync=True)
    finally:
        _inline = None


class _HeldInserts(ORM):
    """django-q2's ORM broker, holding the queue rows it is given for one bulk INSERT."""

    def __init__(self, list_key: str):
        super().__init__(list_key=list_key)
        self.rows: list[OrmQ] = []
        self.taken: list[tuple[int, dict, int]] = []  # (row's index, taken, chunk pk)

    def enqueue(self, task) -> str:
        # As ORM.enqueue writes it, in the same transaction when there is one.
        self.rows.append(OrmQ(key=self.list_key or Conf.CLUSTER_NAME, payload=task,
                              lock=timezone.now()))
        return "(held for one INSERT)"  # django-q2 logs it as the queue row's id

    def take_last(self, taken: dict, chunk_pk) -> None:
        """Write the last row taken, as a dequeue leaves it: no worker gets it before
        ``CLEANUP_SYNC_CLAIM_SECONDS`` have passed."""
        self.rows[-1].lock = timezone.now() + timedelta(seconds=conf.SYNC_CLAIM_SECONDS)
        self.taken.append((len(self.rows) - 1, taken, chunk_pk))

    def insert(self) -> None:
        # executemany, not bulk_create: Django's UNNEST bulk insert quotes each payload
        # in Python inside an array literal, seven times slower for items messages.
        sql = f'INSERT INTO "{OrmQ._meta.db_table}" ("key", "payload", "lock") VALUES (%s, %s, %s)'
        taken_rows = {index for index, _, _ in self.taken}
        with connections[self.get_connection().db].cursor() as cursor:
            for index, taken, chunk_pk in self.taken:  # a --sync run's: their ids are kept
                row = self.rows[index]
                cursor.execute(f"{sql} RETURNING id", [row.key, row.payload, row.lock])
                taken[chunk_pk] = (cursor.fetchone()[0], row.lock)
            if free := [(row.key, row.payload, row.lock) for index, row in enumerate(self.rows)
                        if index not in taken_rows]:
                cursor.executemany(sql, free)
        self.rows.clear()
        self.taken.clear()


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
