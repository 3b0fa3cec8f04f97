"""The chunk and run state machine: every write of a chunk's or a run's state and
counters, and its guard.

Nothing else writes the ledger's runs and chunks: their creation, their states, their
delivery and send counters, a run's planning frontier. Each transition is one function
whose UPDATE names the states it may leave, so a stale caller, a second click or a late
delivery changes nothing: a committed chunk is never dead-lettered, a cancelled run
stays cancelled, and counters only ever add. A chunk's delivery and the window's
writes are the database's own functions (cleanup/sql/delivery_v1.sql, window_v1.sql,
installed by migration, versioned so that workers of two releases overlap during a
deploy): each transition here is then one call, one round trip, and this module is
their only caller. It imports only the models: what happens around a transition (the
window topped up, the run settled) is cleanup.engine.outcomes's, one level up.

    planned ──enqueue──▶ enqueued ──commit──▶ committed ──acknowledge──▶ acknowledged
       │                  │   ▲                   ▲
       │                retry │ (redelivery)      │ commit
       │                  ▼   │                   │
       └──────────────▶ retrying ─────────────────┘
    planned, enqueued, retrying ──dead_letter──▶ dead_lettered ──requeue──▶ enqueued
                                                        └──discard──▶ discarded
    planned, enqueued, retrying ──cancel (or begin, its run cancelled)──▶ cancelled

A run is running while it is still planning (cleanup.engine.window) or any chunk is
unfinished, then completed or completed with dead letters (``settle_run``);
``cancel_runs`` ends it for good.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime

import structlog
from django.db import connection
from django.db.models import JSONField
from django.utils import timezone

from cleanup.exceptions import cause_key
from cleanup.models import Chunk, Run

log = structlog.get_logger("cleanup.ledger")

# A chunk keeps the history of its last deliveries only: one requeued again and again
# (or a message duplicated a thousand times) must not grow its row without end.
HISTORY_KEPT = 50


def planned_to_enqueued(pks: Iterable[int], now: datetime | None = None) -> int:
    """planned → enqueued, as their messages are sent."""
    return _call(_ENQUEUED, list(pks), now or timezone.now())


# The ledger's functions (cleanup/sql/delivery_v1.sql, window_v1.sql), one call each...
# (The start and the commit force their session's next flush of its counters, so a
# chunk's WAL counts its transaction alone: cleanup/sql/wal_v1.sql.)
_START = "SELECT cleanup_delivery_start_v1(%s, %s, %s, %s, %s, %s, %s), cleanup_wal_mark_v1()"
_BEGIN = "SELECT * FROM cleanup_chunk_begin_v1(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
_COMMITTED = (
    "SELECT done, NULL, CASE WHEN done THEN cleanup_wal_mark_v1() END "
    "FROM (SELECT cleanup_chunk_committed_v1(%s, %s, %s, %s, %s, %s, %s, %s, %s) AS done) "
    "AS committed")
_COMMITTED_THEN_OPEN = (
    "SELECT done, CASE WHEN done THEN cleanup_top_up_open_v1(%s, %s, %s, %s) END, "
    "CASE WHEN done THEN cleanup_wal_mark_v1() END "
    "FROM (SELECT cleanup_chunk_committed_v1(%s, %s, %s, %s, %s, %s, %s, %s, %s) AS done) "
    "AS committed")
_WAL = "SELECT cleanup_chunk_wal_v1(%s, %s::jsonb, %s::jsonb, %s)"
_NOOP = "SELECT cleanup_chunk_noop_v1(%s, %s, %s, %s, %s)"
_RETRYING = "SELECT cleanup_chunk_retrying_v1(%s, %s, %s, %s, %s, %s)"
_DEAD_LETTERED = "SELECT cleanup_chunk_dead_lettered_v1(%s, %s, %s, %s, %s, %s, %s)"
_OPEN = "SELECT cleanup_top_up_open_v1(%s, %s, %s, %s)"
_LOCK_RUN = "SELECT cleanup_run_lock_v1(%s, %s)"
_LATEST = "SELECT cleanup_run_latest_v1(%s, %s)"
_SETTLE = "SELECT cleanup_run_settle_v1(%s, %s)"
_PLANNED = "SELECT cleanup_run_planned_v1(%s, %s::jsonb, %s::jsonb, %s::jsonb, %s)"
# ... and the others (cleanup/sql/ledger_v1.sql).
_CREATED = "SELECT cleanup_run_created_v1(%s::jsonb)"
_ELIGIBLE = "SELECT cleanup_run_eligible_v1(%s, %s)"
_PLANNING_FAILED = "SELECT cleanup_run_planning_failed_v1(%s, %s)"
_SENT = "SELECT cleanup_runs_sent_v1(%s::jsonb)"
_ENQUEUED = "SELECT cleanup_chunks_enqueued_v1(%s::bigint[], %s)"
_RECONCILED = "SELECT cleanup_chunks_reconciled_v1(%s::bigint[], %s)"
_ACKNOWLEDGED = "SELECT cleanup_chunk_acknowledged_v1(%s, %s, %s)"
_REQUEUED = "SELECT cleanup_chunks_requeued_v1(%s::bigint[], %s)"
_DISCARDED = "SELECT cleanup_chunks_discarded_v1(%s::bigint[], %s, %s)"
_CANCELLED = "SELECT cleanup_runs_cancelled_v1(%s::uuid[], %s)"


def _call(sql: str, *args):
    """One call of the ledger's functions, in one round trip; its first value."""
    with connection.cursor() as cursor:
        cursor.execute(sql, args)
        return cursor.fetchone()[0]


class Committed:
    """What ``to_committed`` did: true if the chunk moved to committed; ``opened``, the
    window's top-up opened in the same round trip (``open_top_up``), where asked and
    the chunk moved; ``wal_mark``, its session's WAL so far where the server counts it
    (``record_wal`` takes it once the transaction committed)."""

    def __init__(self, done: bool, opened: dict | None = None, wal_mark: str | None = None):
        self.done, self.opened, self.wal_mark = done, opened, wal_mark

    def __bool__(self) -> bool:
        return self.done


def to_committed(chunk: Chunk, *, deleted: int, retries: int, elapsed: float,
           updated: int = 0, locked: int = 0, cpu_wait: float | None = None,
           delivery: int | None = None, then_open: tuple[str, int, int, int] | None = None
           ) -> Committed:
    """unfinished → committed, with the outcome, in the transaction of the chunk's DELETE.

    ``elapsed`` covers the transaction up to this write (the commit itself is not in
    it); ``cpu_wait`` is how much of it the worker spent waiting for a CPU; ``locked``
    the eligible rows it skipped because another transaction kept them locked;
    ``delivery`` the number of the delivery that committed it, ended in its history.
    ``then_open``: ``open_top_up``'s arguments, for a top-up opened in the same round
    trip once the chunk moved.
    """
    args = [chunk.pk, delivery, deleted, updated, locked, retries, round(elapsed * 1000),
            None if cpu_wait is None else round(cpu_wait * 1000), timezone.now()]
    with connection.cursor() as cursor:
        if then_open is None:
            cursor.execute(_COMMITTED, args)
        else:
            cursor.execute(_COMMITTED_THEN_OPEN, [*then_open, *args])
        done, opened, wal_mark = cursor.fetchone()
    return Committed(done, _opened(opened) if opened else None, wal_mark)


def record_wal(chunk: Chunk, started: str, committed: str, lock_ms: int) -> int | None:
    """Keep on the committed chunk the WAL its transaction wrote, read after its commit
    from the marks of its delivery's start (``start_delivery``'s) and of its commit
    (``to_committed``'s); None where it cannot be told, a transaction that ran on
    another server connection than its start's among them. Its own write waits for a
    lock at most ``lock_ms``."""
    return _call(_WAL, chunk.pk, started, committed, lock_ms)


def open_top_up(policy_name: str, window: int, latest: int, lock_ms: int) -> dict:
    """Open the policy's top-up: its planning lock (the transaction's), its running runs
    that still plan (``runs``, oldest first), its chunks in flight (``flying``), whether
    a halt is open (``halted``), and the oldest run locked for planning (``locked``,
    ``lock_run``'s, with its ``latest`` chunks) where the window has room and no halt
    is open; or the ``error`` of a lock wait past ``lock_ms``, the transaction going
    on."""
    return _opened(_call(_OPEN, policy_name, window, latest, lock_ms))


def lock_run(run_id, latest: int) -> Run | None:
    """A run locked for planning, read after the lock was granted, with the pace of its
    ``latest`` done chunks (``latest_chunks``, for cleanup.engine.sizing); None if it is
    gone."""
    return _locked_run(_call(_LOCK_RUN, run_id, latest))


def latest_chunks(run_id, latest: int) -> list[dict]:
    """The pace of the run's ``latest`` done chunks, newest first (cleanup.engine.sizing)."""
    return json.loads(_call(_LATEST, run_id, latest))


def _opened(text: str) -> dict:
    opened = json.loads(text)
    opened["locked"] = _locked_run(opened.get("locked"))
    return opened


def _locked_run(row) -> Run | None:
    if isinstance(row, str):
        row = json.loads(row)
    if row is None:
        return None
    run = _loaded(Run, row)
    run.latest_chunks = row["latest_chunks"]
    return run


def count_noop(chunk: Chunk, *, retries: int, already: str,
               delivery: int | None = None) -> None:
    """A delivery of a chunk that had finished (``already``, its state): completed, and
    it changed nothing."""
    _call(_NOOP, chunk.pk, delivery, retries, str(already), timezone.now())


def start_delivery(run_id, chunk_id: int, *, received_at: datetime | None, worker: str = "",
                   lock_ms: int) -> tuple[Chunk, int] | None:
    """A delivery started: the chunk locked, its delivery counted and entered in its
    history (ended at once if the chunk is dead-lettered), committed on its own (outside
    a transaction), before the work and without waiting for its flush, so a killed
    worker leaves its trace. ``received_at`` None for a message too malformed to be
    delivered; ``lock_ms`` bounds the wait for the chunk's lock. Returns the chunk (with
    its run) as it was before the count, and the delivery's number; None if the run has
    no such chunk. The chunk's ``wal_mark`` is the start's session and its WAL so far,
    where the server counts it (``record_wal``)."""
    with connection.cursor() as cursor:
        cursor.execute(_START, [run_id, chunk_id, worker, received_at, timezone.now(),
                                lock_ms, HISTORY_KEPT])
        started, wal_mark = cursor.fetchone()
    if started is None:
        return None
    started = json.loads(started)  # Django reads jsonb as text
    chunk = _loaded(Chunk, started["chunk"])
    chunk.run = _loaded(Run, started["run"])
    chunk.wal_mark = wal_mark
    return chunk, started["delivery"]


def begin(chunk: Chunk, *, bounds: tuple[int, int, int], application: str,
          asynchronous: bool, row_lock_ms: int | None) -> tuple[str, int]:
    """Open the chunk's transaction: bounded and named for the chunk, the chunk locked,
    and cancelled if its run was (unfinished → cancelled: the run's cancel passed the
    chunk by while a delivery held it). ``bounds``: the lock wait, statement and time
    idle in it, in ms. ``row_lock_ms`` bounds the lock waits that
    follow, where the chunk's statement may wait for learners' rows. Returns the chunk's
    state and planned rows."""
    with connection.cursor() as cursor:
        cursor.execute(
            _BEGIN,
            [chunk.pk, *bounds, application,
             f"run {chunk.run_id} chunk {chunk.chunk_id}", str(chunk.run_id),
             str(chunk.chunk_id), asynchronous, row_lock_ms])
        row = cursor.fetchone()
    if row is None:
        raise Chunk.DoesNotExist(f"chunk {chunk.pk} is gone")
    return row


def _json_value(value) -> str:
    """A value JSON has no type for, as PostgreSQL reads it back exactly: a moment with
    its microseconds (Django's encoder keeps milliseconds), a UUID as its text."""
    return value.isoformat() if isinstance(value, datetime) else str(value)


def _loaded(model, row: dict):
    """An instance of ``model`` from its row as the database's ``to_jsonb`` gives it."""
    fields = model._meta.concrete_fields
    values = [row.get(field.column) for field in fields]
    values = [value if value is None or isinstance(field, JSONField)
              else field.to_python(value) for field, value in zip(fields, values, strict=True)]
    return model.from_db(connection.alias, [field.attname for field in fields], values)


def to_acknowledged(run_id, chunk_id: int) -> bool:
    """committed → acknowledged, once the broker has acknowledged the message."""
    return _call(_ACKNOWLEDGED, run_id, chunk_id, timezone.now())


def to_retrying(chunk: Chunk, *, error: str, retries: int, delivery: int | None = None) -> bool:
    """unfinished → retrying: the delivery failed transiently and is left for redelivery."""
    return _call(_RETRYING, chunk.pk, delivery, error, cause_key(error),
                 retries, timezone.now())


def to_dead_lettered(chunk: Chunk, reason: str, failure_class: str, *,
                received: str = "", delivery: int | None = None) -> bool:
    """unfinished → dead_lettered with the class of its failure (and the message the
    delivery carried, where it differs from the one sent); False if it had finished
    (a committed chunk is never dead-lettered).

    A verdict of deliveries that kept dying (poison, or a transient error that never
    cleared) is not an error of its own: the last real error the deliveries met (a
    lock timeout) stays the chunk's cause beside it. (A transient error is otherwise
    retried, never dead-lettered.)
    """
    return _call(_DEAD_LETTERED, chunk.pk, delivery, reason,
                 cause_key(reason), str(failure_class), received, timezone.now())


def dead_to_enqueued(pks: Iterable[int]) -> list[Chunk]:
    """dead_lettered → enqueued, unless the run was cancelled (the caller settles the
    runs, which reopen).

    The chunks are locked, then their runs, and only then is "not cancelled" settled: a
    cancel that committed while the chunks were being locked is seen. The deliveries
    that never completed are set aside, so the poison limit counts afresh; the counters
    themselves keep adding. Returns the chunks requeued, locked.
    """
    return _chunks(_call(_REQUEUED, list(pks), timezone.now()))


def dead_to_discarded(pks: Iterable[int], reason: str) -> list[Chunk]:
    """dead_lettered → discarded with a reason; returns the chunks discarded, locked."""
    return _chunks(_call(_DISCARDED, list(pks), reason, timezone.now()))


def runs_to_cancelled(run_ids: Iterable) -> list[tuple[Run, int]]:
    """running → cancelled, and each run's unfinished chunks → cancelled; its frontier
    stops.

    Chunks are locked before runs: the order a committing worker takes its locks in. A
    chunk requeued between the two is cancelled too, unless a delivery holds it now
    (its commit then finds the run cancelled and keeps it so). Returns each cancelled
    run with the number of its chunks cancelled.
    """
    cancelled = json.loads(_call(_CANCELLED, [str(pk) for pk in run_ids], timezone.now()))
    return [(_loaded(Run, entry["run"]), entry["chunks"]) for entry in cancelled]


def _chunks(text: str) -> list[Chunk]:
    return [_loaded(Chunk, row) for row in json.loads(text)]


def chunk_fields(chunk: Chunk) -> dict:
    """What every log line about a chunk names it by."""
    return {"run_id": str(chunk.run_id), "chunk_id": chunk.chunk_id, "policy": chunk.run.policy}


def in_lock_order(run_ids) -> list:
    return list(Run.objects.filter(pk__in=list(run_ids)).order_by("created_at", "pk")
                .values_list("pk", flat=True))


def record_eligible(run_id, rows: int) -> bool:
    """The rows eligible at dispatch, recorded once (a fact of the dispatch, like its
    cutoff); False if it had been recorded already."""
    return _call(_ELIGIBLE, run_id, rows)


def settle_run(run_id) -> Run:
    """Bring a run's state in line with its chunks; a cancelled run stays cancelled.

    Running while it is still planning or any chunk is unfinished; then completed, or
    completed with dead letters. Locking the run row serialises the last chunks of a run: a chunk
    committing at the same moment waits here, then its count sees this one's commit.
    """
    settled = _call(_SETTLE, run_id, timezone.now())
    if settled is None:
        raise Run.DoesNotExist(f"run {run_id} is gone")
    settled = json.loads(settled)
    run = _loaded(Run, settled["run"])
    if settled["changed"]:
        log.info("run settled", run_id=str(run.id), policy=run.policy, state=str(run.state))
    return run


def create_run(**fields) -> Run:
    """A new run, as dispatch froze it (its cutoff, parameters, span and frontier)."""
    run = Run(**fields)
    row = {field.column: (field.value_from_object(run) if isinstance(field, JSONField)
                          else field.get_prep_value(field.value_from_object(run)))
           for field in Run._meta.concrete_fields}
    _call(_CREATED, json.dumps(row, default=_json_value))
    run._state.adding = False
    return run


def record_planned(run: Run, chunks: list[dict], queue: list) -> dict:
    """The chunks planned for the run (``chunks``: each one's ``chunk_id``, ``state``,
    ``message``, ``planned_rows`` and ``rows_estimated``; enqueued already when its
    message is sent in this transaction), their queue rows (``queue``: django-q2's
    ``OrmQ`` rows, held back, where its table is in the ledger's database), written with
    how far the run's planning has got (its frontier, whether it planned all, its
    candidates and chunks so far, its next chunk's size, the messages it sent; any
    planning error cleared), and the run settled once it planned all. The caller holds
    the run's row lock, so a count another sender adds (count_sent) waits for this
    write and adds to it. Returns each chunk's row id by its id in the run (as text)
    and the queue rows' ids, or the ``error`` that kept every write out, the
    transaction going on."""
    planning = {"frontier": run.frontier, "planned_all": run.planned_all,
                "candidates": run.candidates, "chunks_planned": run.chunks_planned,
                "next_chunk_size": run.next_chunk_size, "max_span": run.max_span,
                "messages_sent": run.messages_sent}
    rows = [{"key": row.key, "payload": row.payload, "lock": row.lock.isoformat()}
            for row in queue]
    return json.loads(_call(_PLANNED, run.pk, json.dumps(chunks, default=_json_value),
                            json.dumps(planning), json.dumps(rows), timezone.now()))


def record_planning_error(run_id, error: str) -> None:
    """Keep why planning the run's next chunk failed (it is tried again later)."""
    _call(_PLANNING_FAILED, run_id, error)


def count_sent(per_run: dict) -> None:
    """Messages sent, per run (first sends and re-sends). Counted on the run, not its
    chunks: a chunk row may be locked by a delivery in progress, and a re-send must
    not wait for it."""
    if per_run:
        _call(_SENT, json.dumps({str(run_id): sent for run_id, sent in per_run.items()}))


def count_reconciled(pks: Iterable[int], now: datetime) -> None:
    """Chunks the reconciler re-sent."""
    _call(_RECONCILED, list(pks), now)
