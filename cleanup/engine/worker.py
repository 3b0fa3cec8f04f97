"""Apply one chunk: the conditional DELETE and its ledger row commit together; rows
locked elsewhere are skipped and counted, and a message no chunk takes is kept as an
orphan."""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from enum import StrEnum
from typing import Any

import structlog
from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction
from django.utils import timezone

from cleanup import faults
from cleanup.bounds import is_lock_timeout
from cleanup.conf import conf
from cleanup.engine import (
    cpu_wait,
    leases,
    messages,
    outcomes,
    pressure,
    transitions,
    transport,
)
from cleanup.engine.messages import ChunkMessage
from cleanup.exceptions import MalformedMessage, UnknownPolicy, traceback_of
from cleanup.expressions import PairsIn
from cleanup.models import Chunk, OrphanMessage
from cleanup.policies import Policy, get_policy

log = structlog.get_logger("cleanup.worker")
ledger_log = structlog.get_logger("cleanup.ledger")

# Deadlocks, lock and statement timeouts, serialization failures and dropped
# connections mostly surface as one of these; each can succeed when tried again.
TRANSIENT_ERRORS = (OperationalError, InterfaceError)
# ... and these SQLSTATEs, whatever class the driver gives them: the server ended the
# session (an idle transaction past its timeout is an InternalError, 25P03; a shutdown
# or an operator's pg_terminate_backend, 57P0x), or the connection failed (08xxx).
# A process that froze mid-chunk wakes up to one of them: its chunk is redelivered,
# never dead-lettered for it.
SESSION_ENDED = ("25P03", "57P01", "57P02", "57P03")


class CommitFailed(OperationalError):
    """A chunk's COMMIT failed without the server saying why: whether it committed is
    unknown, so it is tried again (its predicate makes a second try safe). Behind a
    pooler, a session the server ended while it sat idle reports itself only so."""


@contextmanager
def _chunk_transaction() -> Iterator[None]:
    """A transaction whose COMMIT failing with no SQLSTATE is a ``CommitFailed``; one
    the server refused for a reason (a deferred constraint) stays what it is."""
    body_done = False
    try:
        with transaction.atomic():
            yield
            body_done = True
    except DatabaseError as exc:
        said = getattr(exc.__cause__, "sqlstate", None)
        if body_done and not said and not isinstance(exc, TRANSIENT_ERRORS):
            raise CommitFailed(f"the chunk's commit failed: {exc}") from exc
        raise


def transient(exc: BaseException) -> bool:
    """Whether another attempt, on a new connection if need be, may succeed."""
    if isinstance(exc, TRANSIENT_ERRORS):
        return True
    state = getattr(exc.__cause__, "sqlstate", None) or ""
    return state in SESSION_ENDED or state.startswith("08")


class Outcome(StrEnum):
    DELETED = "deleted"
    UPDATED = "updated"  # an update policy's chunk changed rows
    NOOP = "noop"
    DEAD_LETTERED = "dead_lettered"


def apply_chunk(raw, *, here: bool = False) -> Outcome:
    """Apply one delivery of a chunk message and return its outcome.

    Returns only after the outcome committed. A transient error that outlasts the
    in-task retries is re-raised, so the broker delivers the message again. ``here``:
    the process that dispatched the run applies it (``--sync``), and no broker's
    acknowledgement follows the commit, which is therefore flushed before it returns.
    """
    try:
        message = messages.parse(raw)
        policy = get_policy(message.policy)
    except (MalformedMessage, UnknownPolicy) as exc:
        return _dead_letter_message(raw, exc)

    chunk, delivery = _start_delivery(raw, message, policy)
    if chunk is None or chunk.state == Chunk.State.DEAD_LETTERED:
        return Outcome.DEAD_LETTERED

    retries, skip_locked = 0, False
    while True:
        # The pressure is read here, where this process holds no learner's row; inside
        # the chunk's transaction the host's indicators are not read again.
        pressure.check(policy)
        try:
            with pressure.holding_rows():
                return _apply(chunk, message, policy, retries, delivery, here=here,
                              skip_locked=skip_locked)
        except Exception as exc:
            _reset_broken_connection()
            if not skip_locked and is_lock_timeout(exc):
                # Learners' rows another transaction keeps locked: the chunk goes again
                # at once without them, and a later pass takes them.
                skip_locked, retries = True, retries + 1
                continue
            if not transient(exc):
                # Deterministic (a bug, a predicate the database rejects): another
                # delivery would fail the same way.
                outcomes.dead_lettered(chunk, traceback_of(exc), Chunk.FailureClass.ERROR,
                                       delivery=delivery)
                return Outcome.DEAD_LETTERED
            if retries >= conf.TRANSIENT_RETRIES:
                _record_failure(chunk, exc, retries, delivery)
                raise
            retries += 1
            time.sleep(conf.TRANSIENT_BACKOFF * 2 ** (retries - 1) * random.uniform(0.5, 1.5))


def chunk_statement(policy: Policy, message: ChunkMessage, frozen: dict[str, datetime]):
    """Return the queryset whose delete() (or, for an update policy, update()) is the
    chunk's single conditional statement.

    ``frozen`` is the run's parameters as stored at dispatch, never recomputed.
    """
    rows = policy.eligible_rows(frozen)
    if message.items is not None:
        return rows.filter(PairsIn("pk", policy.observed_field, message.items))
    partition = {policy.partition_column: message.partition} if policy.partition_column else {}
    return rows.filter(**partition, pk__gte=message.start_id, pk__lt=message.end_id)


def _apply(chunk: Chunk, message: ChunkMessage, policy: Policy, retries: int,
           delivery: int, *, here: bool = False, skip_locked: bool = False) -> Outcome:
    started, waited = time.monotonic(), cpu_wait.waited()
    with _chunk_transaction():
        faults.reach(faults.BEFORE_CHUNK_LOCK)
        # Not the message: the delivery's start already compared it with the ledger.
        state, planned_rows = transitions.begin(
            chunk, bounds=(conf.LOCK_TIMEOUT_MS, conf.STATEMENT_TIMEOUT_MS,
                           conf.IDLE_IN_TRANSACTION_TIMEOUT_MS),
            application=pressure.CHUNK_APPLICATION_NAME,
            asynchronous=not here and transport.queue_shares_transaction(),
            row_lock_ms=None if skip_locked else conf.ROW_LOCK_WAIT_MS)
        deleted = updated = locked = 0
        committed = None
        if state not in Chunk.UNFINISHED:
            transitions.count_noop(chunk, retries=retries, already=state, delivery=delivery)
            outcome = Outcome.NOOP
        else:
            eligible = chunk_statement(policy, message, chunk.run.frozen)
            statement = skipped(eligible) if skip_locked else eligible
            if policy.update is not None:
                # One UPDATE with the whole predicate in its own WHERE, as for a DELETE.
                updated = statement.update(**policy.update)
                outcome = Outcome.UPDATED if updated else Outcome.NOOP
            else:
                if policy.before_delete is not None:
                    statement = _locked(statement)
                    policy.before_delete(statement)
                deleted, _ = statement.delete()
                outcome = Outcome.DELETED if deleted else Outcome.NOOP
            if skip_locked:
                # What is still eligible here is what others kept locked: the rows this
                # transaction changed are gone from its sight or no longer eligible.
                locked = eligible.count()
            committed = outcomes.committed(
                chunk, deleted=deleted, updated=updated, locked=locked, retries=retries,
                elapsed=time.monotonic() - started, cpu_wait=cpu_wait.since(waited),
                policy=policy, delivery=delivery)
            faults.reach(faults.BEFORE_COMMIT)
    wal_bytes = _record_wal(chunk, committed)
    log.info("chunk outcome", run_id=message.run_id, chunk_id=message.chunk_id,
             policy=policy.name, outcome=str(outcome), mutation=policy.mutation,
             rows_changed=deleted + updated, rows_deleted=deleted, rows_updated=updated,
             rows_locked=locked, planned_rows=planned_rows,
             already=state if state not in Chunk.UNFINISHED else None,
             transient_retries=retries, wal_bytes=wal_bytes)
    if (message.items is not None
            and logging.getLogger("cleanup.worker").isEnabledFor(logging.DEBUG)):
        for pk, observed in message.items:
            text = observed.isoformat() if isinstance(observed, datetime) else observed
            log.debug("item", run_id=message.run_id, chunk_id=message.chunk_id,
                      idempotency_key=f"{policy.idempotency_prefix}:{pk}:{text}")
    return outcome


def _record_wal(chunk: Chunk, committed: transitions.Committed | None) -> int | None:
    """Keep the WAL the chunk's transaction wrote, where the server counted it for the
    session (cleanup/sql/wal_v1.sql): read after the commit, in a statement of its own.
    None where it is unknown: no counters, or a transaction pooler that ran the chunk's
    transaction on another server connection than its start's. The outcome has
    committed: whatever happens here is logged, and changes nothing of it."""
    started = getattr(chunk, "wal_mark", None)
    if (not committed or committed.wal_mark is None or started is None
            or connection.in_atomic_block):
        return None  # (in a caller's transaction nothing has committed, nor flushed)
    if json.loads(started)["pid"] != json.loads(committed.wal_mark)["pid"]:
        return None
    try:
        return transitions.record_wal(chunk, started, committed.wal_mark,
                                      conf.LOCK_TIMEOUT_MS)
    except DatabaseError as exc:
        _reset_broken_connection()
        log.warning("chunk WAL not recorded", **transitions.chunk_fields(chunk),
                    error=str(exc).strip())
        return None


def _locked(doomed):
    """Lock the rows the DELETE is about to remove and narrow it to exactly those.

    A hook that records what is deleted (a host's archive, say) must see the same
    rows as the DELETE; without the narrowing, a row that became eligible while the lock
    waited (a chunk committing meanwhile) would be deleted without being summed. It
    waits for the next run instead.
    """
    # In pk order and without the model's default ordering, which joins the run.
    locked = list(doomed.select_for_update().order_by("pk").values_list("pk", flat=True))
    return doomed.filter(pk__in=locked)


# Rows another transaction keeps locked never stall a chunk. A chunk's statement waits
# for learners' rows at most ``CLEANUP_ROW_LOCK_WAIT_MS`` (50 ms: a renewal commits in a
# few). Past it the worker applies the chunk again at once with its statement narrowed
# by ``skipped``, which locks the rows it can and leaves the others (``FOR UPDATE SKIP
# LOCKED``); what is still eligible afterwards is counted as ``rows_locked`` and left to
# a later run. Skipping is the fallback, not the rule: locking each row first costs the
# statement 2.2-2.5 times as much (docs/operations.md).

def skipped(eligible):
    """The chunk's statement narrowed to the eligible rows no other transaction keeps
    locked, which it locks first (``FOR UPDATE SKIP LOCKED``): nothing waits for the
    others. The whole predicate stays in the statement's own WHERE, so a row renewed
    between the lock and the DELETE survives."""
    unlocked = eligible.select_for_update(skip_locked=True).order_by().values("pk")
    return eligible.filter(pk__in=unlocked)


def _start_delivery(raw, message: ChunkMessage,
                    policy: Policy) -> tuple[Chunk | None, int | None]:
    """Count the delivery in its own commit, entered in the chunk's history with its
    number (transitions.start_delivery); dead-letter a chunk that keeps dying or whose
    message it cannot act on. No chunk if the message names none or was refused.

    The start is committed before the work so a worker killed mid-chunk still leaves
    its trace: deliveries started minus completed is what django-q2 cannot count. That
    commit does not wait for its flush (docs/design.md, *A delivery's start*); a message
    naming no chunk is kept after it, flushed as the server's setting says.
    """
    started = transitions.start_delivery(message.run_id, message.chunk_id,
                                         received_at=timezone.now(),
                                         worker=leases.this_process(),
                                         lock_ms=conf.LOCK_TIMEOUT_MS)
    if started is None:
        record_orphan(raw, f"run {message.run_id} has no chunk {message.chunk_id}",
                      run_id=message.run_id, chunk_id=message.chunk_id)
        return None, None
    chunk, delivery = started
    failure_class, reason = _refusal(raw, message, policy, chunk)
    if reason:
        _refuse(raw, chunk, reason, failure_class, delivery)
        return None, None
    return chunk, delivery


def _refusal(raw, message: ChunkMessage, policy: Policy, chunk: Chunk) -> tuple[str, str]:
    """The class and reason to refuse the delivery for, if any (the chunk as it was when
    the delivery started)."""
    run = chunk.run
    if run.policy != policy.name or run.cutoff != message.cutoff:
        reason = "message policy or cutoff does not match its run"
    elif message.parameters != run.frozen_parameters:
        reason = "message parameters do not match the ones its run froze"
    elif policy.derive is not None and not run.parameters:
        # Dispatched before its policy derived any: recomputing them would read today's
        # settings, so the run is left to an operator's replay.
        reason = (f"run froze no parameters but policy {policy.name!r} derives some: "
                  "replay it with a new cutoff")
    elif not messages.same_work(raw, message, chunk.message):
        reason = "message items or range differ from the chunk in the ledger"
    elif chunk.state in Chunk.UNFINISHED and (
            _unfinished(chunk) >= conf.MAX_UNFINISHED_DELIVERIES):
        return _kept_dying(chunk)
    else:
        reason = ""
    return Chunk.FailureClass.MALFORMED, reason


def _refuse(raw, chunk: Chunk, reason: str, failure_class: str, delivery: int) -> None:
    """Dead-letter a chunk for a message it cannot act on; if the chunk had already
    finished, keep the message where malformed ones are kept, so it leaves a trace."""
    received = _if_other(raw, chunk)
    if not outcomes.dead_lettered(chunk, reason, failure_class, received=received,
                                   delivery=delivery):
        record_orphan(raw, f"{reason} (chunk already {chunk.state})",
                      run_id=str(chunk.run_id), chunk_id=chunk.chunk_id)


def _if_other(raw, chunk: Chunk) -> str:
    """The received message as text, if it is not the one the ledger sent."""
    if messages.as_dict(raw) == chunk.message:
        return ""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    text = raw if isinstance(raw, str) else json.dumps(raw, indent=1, default=str)
    return text.replace("\x00", "\\u0000")  # PostgreSQL text holds no NUL


def _kept_dying(chunk: Chunk) -> tuple[str, str]:
    """The class and verdict of a chunk whose deliveries kept ending unfinished: a
    transient error that never cleared, if each of them ended on one (a lock held for
    an hour, a connection killed at each try); else poison (deliveries that left no
    error: the chunk kills its worker)."""
    unfinished = _unfinished(chunk)
    verdict = (f"{unfinished} deliveries started without completing "
               f"(limit {conf.MAX_UNFINISHED_DELIVERIES})")
    if chunk.failure_class == Chunk.FailureClass.TRANSIENT and chunk.failures >= unfinished:
        return chunk.failure_class, f"{verdict}: its transient error never cleared"
    return Chunk.FailureClass.POISON, verdict


def _unfinished(chunk: Chunk) -> int:
    return chunk.deliveries - chunk.deliveries_completed - chunk.unfinished_forgiven


def _record_failure(chunk: Chunk, exc: BaseException, retries: int, delivery: int) -> None:
    transitions.to_retrying(chunk, error=traceback_of(exc), retries=retries, delivery=delivery)
    log.warning(
        "chunk failed, left for redelivery",
        **transitions.chunk_fields(chunk),
        outcome="unknown",
        error=str(exc).strip(),
        transient_retries=retries,
    )


def _dead_letter_message(raw, exc: Exception) -> Outcome:
    run_id, chunk_id = messages.identify(raw)
    started = None
    if run_id is not None and chunk_id is not None and 0 <= chunk_id <= CHUNK_ID_MAX:
        started = transitions.start_delivery(run_id, chunk_id, received_at=None,
                                             worker=leases.this_process(),
                                             lock_ms=conf.LOCK_TIMEOUT_MS)
    if started is None:
        record_orphan(raw, str(exc), run_id=run_id, chunk_id=chunk_id)
    else:
        chunk, delivery = started
        _refuse(raw, chunk, f"malformed message: {exc}", Chunk.FailureClass.MALFORMED,
                delivery)
    return Outcome.DEAD_LETTERED


CHUNK_ID_MAX = 2**31 - 1  # PositiveIntegerField on PostgreSQL


def record_orphan(raw: Any, reason: str, *, run_id: str | None = None,
                  chunk_id: int | None = None) -> OrphanMessage:
    """Keep a message no chunk took, with its raw text and what it named, where
    operators look for them."""
    try:
        text = raw if isinstance(raw, str) else json.dumps(raw, default=repr)
    except (TypeError, ValueError):
        text = repr(raw)
    # PostgreSQL text cannot hold NUL; keep it visible as JSON writes it.
    text, reason = (part.replace("\x00", "\\u0000") for part in (text, reason))
    # A chunk id no chunk can have (negative, past the column) stays in the raw text only.
    if not (isinstance(chunk_id, int) and 0 <= chunk_id <= CHUNK_ID_MAX):
        chunk_id = None
    orphan = OrphanMessage.objects.create(raw=text, error=reason, run_id=run_id,
                                          chunk_id=chunk_id)
    ledger_log.warning("orphan message dead-lettered", policy="unknown",
                       outcome="dead_lettered", orphan_id=orphan.pk, run_id=run_id,
                       chunk_id=chunk_id, reason=reason)
    return orphan


def _reset_broken_connection() -> None:
    """Drop a connection the error left unusable, so the next attempt reconnects."""
    if connection.in_atomic_block:
        return
    connection.close_if_unusable_or_obsolete()
