"""The engine's settings: one typed property per CLEANUP_* setting, and the keys of
django-q2's Q_CLUSTER it relies on (``conf.q_cluster``), each read on every access."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType, SimpleNamespace
from typing import Any

from django.conf import settings

PREFIX = "CLEANUP"


class Settings:
    """The engine's settings, each read from ``CLEANUP_<NAME>`` when it is accessed.

    Nothing is cached, so the pytest ``settings`` fixture and override_settings work.
    The types are what the engine expects; the system checks in ``cleanup.checks``
    refuse a value of another type or out of range, naming the setting.
    """

    def __init__(self, source: Any = settings) -> None:
        self._source = source
        # Not a CLEANUP_* setting, so not a property: names() lists those alone.
        self.q_cluster = QueueSettings(source)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Every setting's name without the prefix, in the order they are declared."""
        return tuple(name for name, member in vars(cls).items() if isinstance(member, property))

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every setting's name (without the prefix) and its default."""
        # A namespace with no CLEANUP_* attribute, so each property falls back to its default.
        shipped = cls(source=SimpleNamespace())
        return {name: getattr(shipped, name) for name in cls.names()}

    def _read(self, name: str, default: Any) -> Any:
        return getattr(self._source, f"{PREFIX}_{name}", default)

    @property
    def MAX_UNFINISHED_DELIVERIES(self) -> int:
        """Deliveries of a chunk that may start without completing before it is
        dead-lettered (its worker killed, or transient errors outlasting the in-task
        retries each time); a committed chunk never is."""
        return self._read("MAX_UNFINISHED_DELIVERIES", 5)

    @property
    def TRANSIENT_RETRIES(self) -> int:
        """Transient database errors retried inside one delivery before it is given back
        to the broker, which only redelivers after its redelivery window."""
        return self._read("TRANSIENT_RETRIES", 3)

    @property
    def TRANSIENT_BACKOFF(self) -> float:
        """Base of the jittered exponential backoff between in-task retries, in seconds."""
        return self._read("TRANSIENT_BACKOFF", 0.2)

    @property
    def LOCK_TIMEOUT_MS(self) -> int:
        """PostgreSQL lock_timeout of a chunk's transaction, in milliseconds: a DELETE
        stuck behind a long renewal gives up and is retried rather than hanging."""
        return self._read("LOCK_TIMEOUT_MS", 5000)

    @property
    def ROW_LOCK_WAIT_MS(self) -> int:
        """How long a chunk's statement waits for learners' rows another transaction
        keeps locked before the chunk goes on without them, in milliseconds: it is
        applied again at once, skipping the rows still locked, which a later pass takes."""
        return self._read("ROW_LOCK_WAIT_MS", 50)

    @property
    def FAILING_CHUNKS(self) -> int:
        """How many of a policy's last chunks (across its runs) are weighed: once more
        than half of them were dead-lettered, the policy halts itself (reason
        ``failing``) until resumed."""
        return self._read("FAILING_CHUNKS", 20)

    @property
    def STATEMENT_TIMEOUT_MS(self) -> int:
        """PostgreSQL statement_timeout of a chunk's transaction, in milliseconds: no
        statement of a chunk holds learners' rows longer (set locally, so a pooled
        server connection keeps none of it)."""
        return self._read("STATEMENT_TIMEOUT_MS", 30_000)

    @property
    def IDLE_IN_TRANSACTION_TIMEOUT_MS(self) -> int:
        """PostgreSQL idle_in_transaction_session_timeout of a chunk's transaction, in
        milliseconds: a process that freezes or loses its network mid-chunk has its
        session ended by the server after this long, its locks released and its chunk
        redelivered."""
        return self._read("IDLE_IN_TRANSACTION_TIMEOUT_MS", 5_000)

    @property
    def SYNC_CLAIM_SECONDS(self) -> float:
        """How long the queue holds a ``--sync`` process's messages for it, as a
        dequeue holds a worker's: a process that dies or freezes leaves each to the
        workers this long after it was sent (one it is merely slow to reach is then
        applied by a worker, and its own delivery is a no-op)."""
        return self._read("SYNC_CLAIM_SECONDS", 30)

    @property
    def MAX_REPLICA_LAG(self) -> float:
        """Seconds of replay lag of any streaming standby (pg_stat_replication, read on
        the primary) past which a policy is halted: it plans and sends nothing new."""
        return self._read("MAX_REPLICA_LAG", 10)

    @property
    def MAX_LOCK_WAIT_MS(self) -> int:
        """Milliseconds another session may wait on a lock a chunk holds before the
        policy slows down: its next chunks get a smaller time budget until waits stop."""
        return self._read("MAX_LOCK_WAIT_MS", 200)

    @property
    def PRESSURE_CHECK_SECONDS(self) -> float:
        """How long a policy's pressure reading is reused before the indicators are read
        again (0: at every planning)."""
        return self._read("PRESSURE_CHECK_SECONDS", 2)

    @property
    def PRESSURE_INDICATORS(self) -> list[str] | tuple[str, ...]:
        """Dotted paths of the host's own indicators: callables ``(policy, connection)``
        returning a ``cleanup.engine.pressure.Signal``, read beside the engine's."""
        return self._read("PRESSURE_INDICATORS", [])

    @property
    def SCHEDULE_GRACE_SECONDS(self) -> float:
        """A schedule slot with no run this long after it was due is a missed schedule."""
        return self._read("SCHEDULE_GRACE_SECONDS", 120)

    @property
    def METRICS_ALLOWED_NETWORKS(self) -> list[str] | tuple[str, ...] | str:
        """Client networks allowed to read /metrics: a list of CIDR networks, or one
        string of them separated by commas."""
        return self._read("METRICS_ALLOWED_NETWORKS", ["127.0.0.0/8", "::1/128"])

    @property
    def METRICS_TOKEN(self) -> str:
        """When set, any client sending "Authorization: Bearer <token>" may read
        /metrics, wherever it is."""
        return self._read("METRICS_TOKEN", "")

    @property
    def HEARTBEAT_STALE_SECONDS(self) -> float:
        """A cluster whose workers have not run the (per-minute) heartbeat task for this
        long is reported as not taking work."""
        return self._read("HEARTBEAT_STALE_SECONDS", 180)

    @property
    def NODE_NAME(self) -> str:
        """What this host's clusters are called in heartbeats (the overview, /health);
        empty: the machine's host name. Set it where several clusters share a machine."""
        return self._read("NODE_NAME", "")

    @property
    def LEDGER_RETENTION_DAYS(self) -> int:
        """Finished chunks and slots older than this are purged by the engine's own
        policies, their runs a day later."""
        return self._read("LEDGER_RETENTION_DAYS", 30)

    @property
    def TASK_RESULT_RETENTION_DAYS(self) -> int:
        """django-q2's saved task results older than this are purged."""
        return self._read("TASK_RESULT_RETENTION_DAYS", 7)

    @property
    def EVENT_RETENTION_DAYS(self) -> int:
        """Outbox events delivered or discarded this long ago are purged (their totals
        stay on /metrics); dead and pending ones are kept."""
        return self._read("EVENT_RETENTION_DAYS", 7)

    @property
    def CHUNK_BUDGET_MS(self) -> float:
        """Chunk size from a transaction-time budget: a new run's chunks hold as many rows
        as recent chunks of the policy and scheme deleted in this many milliseconds
        (0: always the policy's chunk_size), bounded by the floor and the ceilings.

        40 ms: at 50 the chunks' p99 reached 100 ms (docs/performance.md).
        """
        return self._read("CHUNK_BUDGET_MS", 40)

    @property
    def MIN_ROWS_PER_CHUNK(self) -> int:
        """Floor of a learned chunk size."""
        return self._read("MIN_ROWS_PER_CHUNK", 50)

    @property
    def WINDOW(self) -> int:
        """Chunks of one policy in flight at once, for a policy that sets no window of its
        own: its runs plan each next chunk as one ends. Above the worker count, so a
        worker finishing a chunk finds the next one already queued."""
        return self._read("WINDOW", 4)

    @property
    def MAX_ITEMS_PER_CHUNK(self) -> int:
        """Ceiling of a learned items chunk size: lower than the range one, because an
        items chunk carries each of its rows in its message."""
        return self._read("MAX_ITEMS_PER_CHUNK", 2_000)

    @property
    def MAX_RANGE_ROWS_PER_CHUNK(self) -> int:
        """Ceiling of a learned range chunk size."""
        return self._read("MAX_RANGE_ROWS_PER_CHUNK", 100_000)

    @property
    def EVENT_MAX_ATTEMPTS(self) -> int:
        """Failed handler calls of an outbox event before it is dead-lettered with its
        cause (cleanup.outbox); a dead event no longer holds back its ordering key."""
        return self._read("EVENT_MAX_ATTEMPTS", 10)

    @property
    def EVENT_BACKOFF_SECONDS(self) -> float:
        """Wait before an outbox event's second attempt, doubled after each failure up
        to EVENT_BACKOFF_MAX_SECONDS; its ordering key waits behind it meanwhile."""
        return self._read("EVENT_BACKOFF_SECONDS", 5)

    @property
    def EVENT_BACKOFF_MAX_SECONDS(self) -> float:
        """The longest wait between two attempts of an outbox event."""
        return self._read("EVENT_BACKOFF_MAX_SECONDS", 600)

    @property
    def EVENT_PAYLOAD_MAX_BYTES(self) -> int:
        """The largest payload ``emit`` stores, in bytes of its JSON: a payload carries
        ids, not documents."""
        return self._read("EVENT_PAYLOAD_MAX_BYTES", 8_192)

    @property
    def EVENT_PAYLOAD_MAX_DEPTH(self) -> int:
        """The deepest nesting of lists and objects ``emit`` stores in a payload (``{}``
        is 1 deep), checked without recursion before the payload is serialised."""
        return self._read("EVENT_PAYLOAD_MAX_DEPTH", 32)


class QueueSettings:
    """The keys of django-q2's ``Q_CLUSTER`` the engine relies on, as ``conf.q_cluster``.

    Read on every access, like the CLEANUP_* settings, with django-q2's own defaults.
    The system checks cleanup.E001, cleanup.E002 and cleanup.W001 judge the values.
    """

    def __init__(self, source: Any = settings) -> None:
        self._source = source

    def _read(self, key: str, default: Any) -> Any:
        return getattr(self._source, "Q_CLUSTER", {}).get(key, default)

    @property
    def timeout(self) -> float | None:
        """Seconds a task may run before django-q2 ends it; None when unset."""
        return self._read("timeout", None)

    @property
    def retry(self) -> float:
        """Seconds after which the broker hands an unacknowledged task out again."""
        return self._read("retry", 60)

    @property
    def orm(self) -> str | None:
        """The database alias of the ORM broker; None for another broker."""
        return self._read("orm", None)

    @property
    def catch_up(self) -> bool:
        """Whether the scheduler starts one run per slot missed during an outage."""
        return self._read("catch_up", True)


conf = Settings()
# Read-only: the defaults live in the properties above.
DEFAULTS: Mapping[str, Any] = MappingProxyType(Settings.defaults())

