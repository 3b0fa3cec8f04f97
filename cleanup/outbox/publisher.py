"""Deliver pending events once each, in order per ordering key: take one with SKIP
LOCKED, call its handler and mark it delivered in one transaction.

A crash anywhere leaves both the handler's writes and "delivered" undone (the event is
taken again) or both done. Several publishers at once never take one event twice: the
row lock and the guarded UPDATE see to it, and an event's ordering key is blocked for
others while it is pending, whoever holds it.

Each call is recorded, and committed, before the handler runs: a handler that kills its
process (or its connection) leaves that record behind, so the next publisher to take
the event counts the call as a failed attempt, and such a handler is dead-lettered like
one that raises instead of being called forever.

A handler whose transaction ends under it (the server ends the session it held idle past
its bound, the connection drops, the handler sends COMMIT or ROLLBACK itself) cannot
have its failure recorded in that transaction: the publisher records it in a new one,
its cause named, and goes on with the batch. The event is never marked delivered outside
its handler's transaction: after a handler's own COMMIT it is taken again, and only its
dedup key keeps what the handler committed from being done twice.

A handler that returns with its transaction marked for rollback (``set_rollback(True)``,
or a database error it swallowed inside ``atomic(savepoint=False)``) kept none of its
writes: its attempt is failed like one that raised, never delivered.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta

from django.db import connections, router, transaction

from cleanup.conf import conf
from cleanup.exceptions import CleanupError, cause_of, traceback_of
from cleanup.models import Event
from cleanup.outbox import events
from cleanup.outbox.handlers import handler_for

logger = logging.getLogger(__name__)

DELIVERED, FAILED, DEAD = "delivered", "failed", "dead"
PENDING = Event.State.PENDING

# The head of every ordering key (the pending event with the lowest id of its key),
# found by a skip scan of event_pending_by_key: one index probe per key, however many
# events wait behind a head. Heads not yet available (in back-off) hold their key back;
# the unordered events ('') are each their own head, the soonest available first.
CANDIDATES = """
WITH RECURSIVE heads(ordering_key, id) AS (
    (SELECT ordering_key, id FROM cleanup_event
     WHERE state = 'pending' AND ordering_key > ''
     ORDER BY ordering_key, id LIMIT 1)
    UNION ALL
    SELECT later.ordering_key, later.id
    FROM heads, LATERAL (
        SELECT ordering_key, id FROM cleanup_event
        WHERE state = 'pending' AND ordering_key > heads.ordering_key
        ORDER BY ordering_key, id LIMIT 1
    ) AS later
)
SELECT id FROM (
    SELECT event.id FROM heads JOIN cleanup_event AS event ON event.id = heads.id
    WHERE event.available_at <= %(horizon)s
    UNION ALL
    (SELECT id FROM cleanup_event
     WHERE state = 'pending' AND ordering_key = '' AND available_at <= %(horizon)s
     ORDER BY available_at, id LIMIT %(limit)s)
) AS candidates
ORDER BY id LIMIT %(limit)s
"""

# One event, locked: still pending and due, and no earlier event of its ordering key is
# pending (whoever holds it: a publisher's uncommitted event is still pending to others).
TAKE = """
SELECT * FROM cleanup_event AS event
WHERE event.id = ANY(%s) AND event.state = 'pending' AND event.available_at <= %s
  AND (event.ordering_key = '' OR NOT EXISTS (
      SELECT 1 FROM cleanup_event AS earlier
      WHERE earlier.ordering_key = event.ordering_key AND earlier.state = 'pending'
        AND earlier.id < event.id))
ORDER BY event.id
LIMIT 1
FOR UPDATE SKIP LOCKED
"""


@dataclass
class PublishResult:
    delivered: int = 0
    failed: int = 0  # the handler's attempt failed; taken again after its back-off
    dead: int = 0  # dead-lettered now: attempts used up, or no handler for its name
    skipped_busy: int = 0  # held by another publisher (or taken by it meanwhile)

    @property
    def handled(self) -> int:
        return self.delivered + self.failed + self.dead

    def as_dict(self) -> dict[str, int]:
        return {**asdict(self), "handled": self.handled}


def publish(batch: int = 100, *, now: datetime | None = None) -> PublishResult:
    """Deliver up to ``batch`` events available at ``now`` (the database's clock when
    None), each in its own transaction; stop early when none is left to take."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise CleanupError(f"batch must be a whole number of at least 1, not {batch!r}")
    horizon = now or database_now()
    result = PublishResult()
    handled: set[int] = set()
    skipped: set[int] = set()
    while result.handled < batch:
        candidates = eligible(horizon, limit=batch - result.handled)
        took = False
        while candidates and result.handled < batch:
            taken = _publish_one(candidates, horizon, now)
            if taken is None:
                skipped.update(candidates)
                break
            pk, outcome = taken
            position = candidates.index(pk)
            skipped.update(candidates[:position])
            candidates = candidates[position + 1:]
            handled.add(pk)
            setattr(result, outcome, getattr(result, outcome) + 1)
            took = True
        if not took:
            break
    result.skipped_busy = len(skipped - handled)
    return result


def eligible(horizon: datetime, *, limit: int) -> list[int]:
    """Ids of the events a publisher may take now, oldest first (read without locks)."""
    with connections[router.db_for_write(Event)].cursor() as cursor:
        cursor.execute(CANDIDATES, {"horizon": horizon, "limit": limit})
        return [pk for (pk,) in cursor.fetchall()]


def take(candidates: list[int], horizon: datetime) -> Event | None:
    """Lock the first of ``candidates`` still pending, available and first of its
    ordering key; skip those another publisher holds. Call inside a transaction."""
    return next(iter(Event.objects.raw(TAKE, [candidates, horizon])), None)


def backoff(attempts: int) -> timedelta:
    """The wait after the ``attempts``-th failure: the base, doubled each time, capped."""
    exponent = min(max(attempts - 1, 0), 62)
    seconds = min(conf.EVENT_BACKOFF_MAX_SECONDS, conf.EVENT_BACKOFF_SECONDS * 2 ** exponent)
    return timedelta(seconds=seconds)


def database_now() -> datetime:
    with connections[router.db_for_write(Event)].cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


# The event again, locked for the handler's transaction, if it is still this call's;
# the same statement bounds that transaction, for it alone (a pooled server connection
# keeps none of it): a publisher that freezes holding the event (and so its ordering
# key) loses its session after the idle bound, its handler's writes roll back and the
# event is taken again after its back-off; a statement that hangs is cancelled.
LOCK_FOR_CALL = """
SELECT event.*, set_config('statement_timeout', %(statement)s, true),
       set_config('idle_in_transaction_session_timeout', %(idle)s, true)
FROM cleanup_event AS event
WHERE event.id = %(id)s AND event.state = 'pending' AND event.call_started_at = %(started)s
FOR UPDATE
"""

# The cause of an attempt whose call never returned.
NEVER_RETURNED = ("its handler's call begun at {started:%Y-%m-%d %H:%M:%S} UTC never "
                  "returned: its publisher died or lost its connection")

# The causes of an attempt whose handler's transaction ended under it, or whose
# statement was cancelled at the bound LOCK_FOR_CALL sets.
IDLE_PAST_BOUND = ("the handler held its transaction idle past {ms} ms "
                   "(CLEANUP_IDLE_IN_TRANSACTION_TIMEOUT_MS): the server ended its session, "
                   "and its writes with it")
CONNECTION_LOST = "the handler's connection was lost, and its writes with it: {error}"
ENDED_BY_HANDLER = ("the handler ended its transaction itself (a COMMIT or ROLLBACK of its "
                    "own), so the event could not be marked delivered with its writes: what "
                    "it wrote before that may have committed, and only its dedup key keeps "
                    "the next attempt from doing it twice")
STATEMENT_PAST_BOUND = ("a statement of the handler ran past {ms} ms "
                        "(CLEANUP_STATEMENT_TIMEOUT_MS), waiting for a lock or working, and "
                        "was cancelled")
IDLE_SESSION_TIMEOUT, QUERY_CANCELED = "25P03", "57014"

# The cause of an attempt whose handler returned normally with its transaction marked
# for rollback: its savepoint would roll its writes back without an error.
MARKED_FOR_ROLLBACK = ("the handler marked its transaction for rollback "
                       "(transaction.set_rollback or a swallowed database error): nothing "
                       "it wrote was kept")


class MarkedForRollback(Exception):
    """The handler returned with its transaction marked for rollback: a failed attempt."""

    def __init__(self) -> None:
        super().__init__(MARKED_FOR_ROLLBACK)


class LostTransaction(Exception):
    """The handler's transaction ended under it: its failure is recorded in a new one."""

    def __init__(self, cause: str, error: str) -> None:
        super().__init__(cause)
        self.cause, self.error = cause, error


def _publish_one(candidates: list[int], horizon: datetime,
                 now: datetime | None) -> tuple[int, str] | None:
    """Take one of ``candidates`` and call its handler: None if none could be taken."""
    event = _begin_call(candidates, horizon, now)
    if event is None:
        return None
    if event.state == DEAD:
        return event.pk, DEAD
    try:
        with transaction.atomic():
            # Still this call's: its record kept other publishers off the event since,
            # and the row lock does while the handler runs.
            locked = next(iter(Event.objects.raw(LOCK_FOR_CALL, {
                "id": event.pk, "started": event.call_started_at,
                "statement": f"{conf.STATEMENT_TIMEOUT_MS}ms",
                "idle": f"{conf.IDLE_IN_TRANSACTION_TIMEOUT_MS}ms"})), None)
            if locked is None:
                return None
            return event.pk, _handle(locked, now)
    except LostTransaction as lost:
        # Django drops a connection whose rollback failed; one broken otherwise is
        # dropped here, so the attempt is recorded on a fresh one.
        transaction.get_connection().close_if_unusable_or_obsolete()
        return event.pk, _record_lost_call(event, lost, now)


def _begin_call(candidates: list[int], horizon: datetime,
                now: datetime | None) -> Event | None:
    """Take the first available of ``candidates`` and record, in a transaction of its
    own, that its handler is being called. An earlier call found still recorded never
    returned: it is counted as a failed attempt, which may make the event dead.

    Nothing here waits (SKIP LOCKED, then the row this transaction holds), so it needs
    no bound of its own."""
    with transaction.atomic():
        event = take(candidates, horizon)
        if event is None:
            return None
        if event.call_started_at is not None:
            cause = NEVER_RETURNED.format(started=event.call_started_at.astimezone(UTC))
            if event.attempts + 1 >= conf.EVENT_MAX_ATTEMPTS:
                _dead_letter(event, cause, cause)
                return event
            events.count_lost_call(event, cause)
            event.attempts += 1
        event.call_started_at, event.available_at = events.begin_call(
            event.pk, now, backoff(event.attempts + 1))
        return event


def _handle(event: Event, now: datetime | None) -> str:
    """Call the event's handler in a savepoint, then record how it went, all in the
    transaction that holds the event's row lock."""
    handler = handler_for(event.name)
    if handler is None:
        reason = f"no handler registered for {event.name}"
        return _record_failure(event, reason, reason, now, dead=True)
    try:
        with transaction.atomic():
            handler(event)
            if transaction.get_rollback():
                # Left so, the savepoint would roll its writes back on exit, silently,
                # and the event be marked delivered without them.
                raise MarkedForRollback
    except Exception as exc:  # noqa: BLE001 - any error of a host's handler is its failure
        error = traceback_of(exc)
        if transaction.get_connection().needs_rollback:
            # Its savepoint could not be rolled back: the transaction it was in is over.
            raise LostTransaction(_lost_cause(exc, error), error) from exc
        return _record_failure(event, _failure_cause(exc, error), error, now)
    if not events.to_delivered(event.pk):  # not under the row lock; never commit effects alone
        raise CleanupError(f"event {event.pk} was no longer pending when delivered")
    return DELIVERED


def _sqlstates(exc: BaseException) -> set[str]:
    """The SQLSTATEs of the database errors behind ``exc``, however it was wrapped."""
    found, seen = set(), set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        found.add(getattr(current, "sqlstate", None) or "")
        current = current.__cause__ or current.__context__
    return found - {""}


def _failure_cause(exc: BaseException, error: str) -> str:
    """The line an operator reads for a handler that raised, its transaction intact."""
    if isinstance(exc, MarkedForRollback):
        return MARKED_FOR_ROLLBACK
    if QUERY_CANCELED in _sqlstates(exc) and "statement timeout" in error:
        return STATEMENT_PAST_BOUND.format(ms=conf.STATEMENT_TIMEOUT_MS)
    return cause_of(error)


def _lost_cause(exc: BaseException, error: str) -> str:
    """Why the handler's transaction ended: its session gone, or ended by the handler."""
    session = transaction.get_connection().connection
    if session is not None and not session.closed:
        return ENDED_BY_HANDLER
    # The server says why it ended a session, and PgBouncer passes that on.
    if IDLE_SESSION_TIMEOUT in _sqlstates(exc):
        return IDLE_PAST_BOUND.format(ms=conf.IDLE_IN_TRANSACTION_TIMEOUT_MS)
    return CONNECTION_LOST.format(error=cause_of(error))


def _record_lost_call(event: Event, lost: LostTransaction, now: datetime | None) -> str:
    """Count the call whose transaction was lost as a failed attempt, with its cause.

    Nothing here waits (SKIP LOCKED): an event settled or held meanwhile is left as it
    is, and a call record left behind is counted by the next publisher to take it."""
    logger.warning("event %s %s %s: %s", event.pk, event.name, event.key, lost.cause)
    with transaction.atomic():
        current = (Event.objects.select_for_update(skip_locked=True)
                   .filter(pk=event.pk, state=PENDING, call_started_at=event.call_started_at)
                   .first())
        if current is None:
            return FAILED
        return _record_failure(current, lost.cause, lost.error, now)


def _record_failure(event: Event, cause: str, error: str, now: datetime | None, *,
                    dead: bool = False) -> str:
    attempts = event.attempts + 1
    if dead or attempts >= conf.EVENT_MAX_ATTEMPTS:
        _dead_letter(event, cause, error)
        return DEAD
    events.to_retrying(event, cause, error, (now or database_now()) + backoff(attempts))
    return FAILED


def _dead_letter(event: Event, cause: str, error: str) -> None:
    """Make the (locked, pending) event dead, its last attempt counted with its cause."""
    logger.warning("event %s %s %s dead-lettered after %s attempt(s): %s",
                   event.pk, event.name, event.key, event.attempts + 1, cause)
    events.to_dead(event, cause, error)
    event.state = Event.State.DEAD
