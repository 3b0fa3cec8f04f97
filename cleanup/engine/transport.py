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
from dataclasses import dataclass, field
from datetime import timedelta

from django.db import DEFAULT_DB_ALIAS, connections, transaction
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


@dataclass
class Outgoing:
    """Chunk messages made ready to send: django-q2 has built and signed each task,
    and with the ORM broker its queue row is held back (``rows``: key, payload, lock)
    for one INSERT, by ``send`` or by the ledger's function that writes the chunks
    (``in_ledger``). ``inline``: messages applied here once the transaction commits
    (django-q2's sync mode); ``per_run``: messages sent, per run."""

    rows: list = field(default_factory=list)
    taken: list = field(default_factory=list)  # (row's index, a --sync run's taken, chunk)
    inline: list = field(default_factory=list)
    per_run: Counter = field(default_factory=Counter)


def outgoing(chunks: Iterable[tuple]) -> Outgoing:
    """Make the messages of ``chunks`` (run id, the chunk's key, message) ready to send;
    sent once ``sent`` is called with the queue rows' ids (if any were held back)."""
    broker = get_broker()
    held = _HeldInserts(broker.list_key) if isinstance(broker, ORM) else None
    ready = Outgoing()
    for run_id, key, message in chunks:
        if Conf.SYNC:
            if run_id not in _taken:  # a run applied here needs no other process
                ready.inline.append((message, str(run_id)))
                ready.per_run[run_id] += 1
            continue
        ready.per_run[run_id] += 1
        async_task(CHUNK_TASK, message, group=str(run_id), broker=held or broker)
        if held is not None and run_id in _taken:
            held.take_last(_taken[run_id], key)
    if held is not None:
        ready.rows, ready.taken = held.rows, held.taken
    return ready


def sent(ready: Outgoing, queue_ids: list[int], pk_of=None) -> None:
    """The held rows of ``ready`` were inserted (``queue_ids``, in order): a --sync run's
    keep theirs (``pk_of`` maps a chunk's key to its pk, where the key was another);
    messages for this process follow the commit."""
    for index, taken, key in ready.taken:
        taken[pk_of(key) if pk_of else key] = (queue_ids[index], ready.rows[index].lock)
    if ready.inline:
        transaction.on_commit(lambda: _apply_inline(ready.inline))


def queue_in_ledger() -> bool:
    """Whether the queue's rows can be written by the ledger's own functions: django-q2's
    ORM broker, its table in the ledger's database."""
    return queue_shares_transaction() and (Conf.ORM or DEFAULT_DB_ALIAS) == DEFAULT_DB_ALIAS


def send(chunks: Iterable[Chunk], *, count: bool = True) -> int:
    """Enqueue the chunks' messages; inside a transaction they commit together with it.

    With the ORM broker the messages go in one INSERT: django-q2 still builds and signs
    each task, and only its row is held back (a round trip per message was most of
    the cost of writing a run). ``count`` False: the caller counts them on the run it
    holds locked.
    """
    ready = outgoing((chunk.run_id, chunk.pk, chunk.message) for chunk in chunks)
    sent(ready, insert_held(ready))
    if count:
        transitions.count_sent(ready.per_run)
    return ready.per_run.total()


def insert_held(ready: Outgoing) -> list[int | None]:
    """Insert the held queue rows of ``ready``; the ids of a --sync run's (the others'
    are not read: None)."""
    ids: list[int | None] = [None] * len(ready.rows)
    if not ready.rows:
        return ids
    taken = {index for index, _, _ in ready.taken}
    # executemany, not bulk_create: Django's UNNEST bulk insert quotes each payload in
    # Python inside an array literal, seven times slower for items messages.
    with connections[Conf.ORM or DEFAULT_DB_ALIAS].cursor() as cursor:
        for index in sorted(taken):
            row = ready.rows[index]
            cursor.execute(f"{_INSERT_ROW} RETURNING id", [row.key, row.payload, row.lock])
            ids[index] = cursor.fetchone()[0]
        if free := [(row.key, row.payload, row.lock) for index, row in enumerate(ready.rows)
                    if index not in taken]:
            cursor.executemany(_INSERT_ROW, free)
    return ids


_INSERT_ROW = f'INSERT INTO "{OrmQ._meta.db_table}" ("key", "payload", "lock") VALUES (%s, %s, %s)'


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
    """django-q2's ORM broker, holding the queue rows it is given for one INSERT."""

    def __init__(self, list_key: str):
        super().__init__(list_key=list_key)
        self.rows: list[OrmQ] = []
        self.taken: list[tuple[int, dict, object]] = []  # (row's index, taken, chunk)

    def enqueue(self, task) -> str:
        # As ORM.enqueue writes it, in the same transaction when there is one.
        self.rows.append(OrmQ(key=self.list_key or Conf.CLUSTER_NAME, payload=task,
                              lock=timezone.now()))
        return "(held for one INSERT)"  # django-q2 logs it as the queue row's id

    def take_last(self, taken: dict, chunk) -> None:
        """Write the last row taken, as a dequeue leaves it: no worker gets it before
        ``CLEANUP_SYNC_CLAIM_SECONDS`` have passed."""
        self.rows[-1].lock = timezone.now() + timedelta(seconds=conf.SYNC_CLAIM_SECONDS)
        self.taken.append((len(self.rows) - 1, taken, chunk))


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
