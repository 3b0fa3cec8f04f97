"""The ledger: runs, their chunks, messages that named no chunk, the schedule slots
that fired and the counters' totals."""

from __future__ import annotations

import uuid
from datetime import datetime

from django.db import models
from django.utils import timezone

from cleanup.display import short_id
from cleanup.expressions import MessageField

# What chunks' statements changed, whichever their policy's mutation: rows deleted, or
# updated. The one definition, as an expression over chunk rows and over sums of them.
ROWS_CHANGED = models.F("rows_deleted") + models.F("rows_updated")


def rows_changed(figures) -> int:
    """Rows changed in ``figures`` (a mapping with rows_deleted and rows_updated)."""
    return figures["rows_deleted"] + figures["rows_updated"]


class Run(models.Model):
    """One trigger of one policy, with its frozen cutoff."""

    class State(models.TextChoices):
        RUNNING = "running", "Running"
        COMPLETED = "completed", "Completed"
        COMPLETED_WITH_DEAD_LETTERS = "completed_with_dead_letters", "Completed with dead letters"
        CANCELLED = "cancelled", "Cancelled"

    class Trigger(models.TextChoices):
        SCHEDULE = "schedule", "Schedule"
        COMMAND = "command", "Command"
        ADMIN = "admin", "Admin"
        REPLAY = "replay", "Replay"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    policy = models.CharField(max_length=100)
    dispatch_key = models.CharField(max_length=255, unique=True)
    cutoff = models.DateTimeField()
    # The other instants the policy's predicate derived from the cutoff at dispatch (a
    # retention deadline), as ISO-8601 text: workers and replays use these, never a
    # setting read again.
    parameters = models.JSONField(default=dict, blank=True)
    scheme = models.CharField(max_length=10)
    state = models.CharField(max_length=32, choices=State.choices, default=State.RUNNING)
    trigger = models.CharField(max_length=16, choices=Trigger.choices)
    # No cascade and no constraint: the retention purge deletes old runs in one
    # statement, and a newer run may still name the one it replayed.
    replay_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.DO_NOTHING, db_constraint=False,
        related_name="replays",
    )
    # A run plans its chunks as it goes: these grow with each chunk planned, and
    # planned_all says the frontier has passed the end of the span.
    candidates = models.PositiveIntegerField(
        default=0, help_text="Rows found eligible in the chunks planned so far."
    )
    chunks_planned = models.PositiveIntegerField(default=0)
    eligible_at_dispatch = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Rows eligible when the run was dispatched, "
        "counted once (the run plans them as it goes); empty for older runs."
    )
    planned_all = models.BooleanField(
        default=False, help_text="Every chunk is planned: the frontier passed the end."
    )
    # The key span at dispatch (range: lowest and highest primary key + 1; items: the
    # oldest observed value, as epoch seconds, and the cutoff), and the frontier: where
    # the next chunk starts (cleanup.engine.planning). No frontier once planned_all.
    span_start = models.BigIntegerField(null=True, blank=True)
    span_end = models.BigIntegerField(null=True, blank=True)
    frontier = models.JSONField(null=True, blank=True)
    planning_error = models.TextField(
        blank=True, help_text="Why planning the next chunk last failed (retried by the "
        "reconciler); empty when it works."
    )
    window = models.PositiveSmallIntegerField(
        default=1, help_text="Chunks of the policy in flight at most, as at dispatch."
    )
    chunk_size = models.PositiveIntegerField(
        default=0, help_text="Rows of the run's first chunks."
    )
    next_chunk_size = models.PositiveIntegerField(
        default=0, help_text="Rows of the next chunk, from the pace of the latest ones."
    )
    max_span = models.PositiveBigIntegerField(
        null=True, blank=True,
        help_text="Widest id span of the next range chunk; empty: no cap.",
    )
    messages_sent = models.PositiveIntegerField(
        default=0, help_text="Chunk messages published: first sends and re-sends."
    )
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    FINISHED = (State.COMPLETED, State.COMPLETED_WITH_DEAD_LETTERS, State.CANCELLED)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["policy", "-created_at"]),
            # The observed field of the run purge: its backlog is read at each scrape.
            models.Index(fields=["created_at"], name="run_created_at"),
        ]
        permissions = [
            ("replay", "Can replay runs and chunks"),
            ("requeue", "Can requeue dead-lettered chunks"),
            ("discard", "Can discard dead-lettered chunks"),
            ("dispatch", "Can dispatch a policy now"),
            ("cancel", "Can cancel runs"),
            ("pause", "Can pause and resume policies"),
        ]

    def __str__(self) -> str:
        return f"{self.policy} run {self.id}"

    @property
    def frozen_parameters(self) -> dict[str, datetime]:
        """The instants the predicate derived from the cutoff at dispatch, by name."""
        return {name: datetime.fromisoformat(text) for name, text in self.parameters.items()}

    @property
    def frozen(self) -> dict[str, datetime]:
        """The predicate's parameters as frozen at dispatch: the cutoff and its deadlines."""
        return {"cutoff": self.cutoff, **self.frozen_parameters}


class Chunk(models.Model):
    """One bounded unit of a run's work and its ledger row."""

    class State(models.TextChoices):
        PLANNED = "planned", "Planned"
        ENQUEUED = "enqueued", "Enqueued"
        RETRYING = "retrying", "Retrying"
        COMMITTED = "committed", "Committed"
        ACKNOWLEDGED = "acknowledged", "Acknowledged"
        DEAD_LETTERED = "dead_lettered", "Dead-lettered"
        DISCARDED = "discarded", "Discarded"
        CANCELLED = "cancelled", "Cancelled"

    class FailureClass(models.TextChoices):
        TRANSIENT = "transient", "Transient database error (retried)"
        POISON = "poison", "Deliveries kept dying (poison)"
        MALFORMED = "malformed", "Malformed or mismatched message"
        ERROR = "error", "Permanent error (a bug or a rejected statement)"

    UNFINISHED = (State.PLANNED, State.ENQUEUED, State.RETRYING)
    DONE = (State.COMMITTED, State.ACKNOWLEDGED)
    FINISHED = (*DONE, State.DEAD_LETTERED, State.DISCARDED, State.CANCELLED)

    # DO_NOTHING keeps the run purge a single DELETE; the database constraint still
    # refuses to delete a run whose chunks remain (they are purged first).
    run = models.ForeignKey(Run, on_delete=models.DO_NOTHING, related_name="chunks")
    # The message's chunk_id, the commands' --chunk ID, the admin's #12.
    chunk_id = models.PositiveIntegerField(
        help_text="The chunk's number within its run, in the order it was planned.")
    state = models.CharField(max_length=16, choices=State.choices, default=State.PLANNED)
    message = MessageField(help_text="The message exactly as sent.")
    planned_rows = models.PositiveIntegerField(default=0)
    rows_estimated = models.BooleanField(
        default=False, db_default=False,
        help_text="Its planned rows were estimated from the run's density, not counted.")
    deliveries = models.PositiveIntegerField(default=0, help_text="Deliveries started.")
    deliveries_completed = models.PositiveIntegerField(
        default=0, help_text="Deliveries that committed an outcome (work or no-op)."
    )
    noop_deliveries = models.PositiveIntegerField(default=0)
    failures = models.PositiveIntegerField(
        default=0, help_text="Deliveries that ended in a retryable error."
    )
    dead_letters = models.PositiveIntegerField(default=0, help_text="Times dead-lettered.")
    duration_ms = models.PositiveIntegerField(
        null=True, blank=True, help_text="Duration of the transaction that committed it."
    )
    cpu_wait_ms = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="Of that duration, how long its worker waited for a CPU (a busy host); "
                  "empty where the kernel does not say.",
    )
    wal_bytes = models.BigIntegerField(
        null=True, blank=True,
        help_text="WAL its committing transaction wrote, in bytes; empty where it was not "
                  "measured (PostgreSQL before 18 keeps no per-session WAL counters).",
    )
    unfinished_forgiven = models.PositiveIntegerField(
        default=0, help_text="Unfinished deliveries an operator's requeue set aside."
    )
    transient_retries = models.PositiveIntegerField(default=0)
    rows_deleted = models.PositiveIntegerField(default=0)
    rows_updated = models.PositiveIntegerField(
        default=0, help_text="Rows an update policy's chunk moved out of eligibility."
    )
    items_skipped = models.PositiveIntegerField(
        default=0, help_text="Planned rows no longer eligible when the chunk ran."
    )
    rows_locked = models.PositiveIntegerField(
        default=0, help_text="Eligible rows another transaction kept locked past the row "
        "lock wait: left for a later pass (skipped: locked)."
    )
    last_error = models.TextField(
        blank=True, help_text="The last real error a delivery met, in full (a traceback)."
    )
    cause = models.CharField(
        max_length=255, blank=True, help_text="The last error's own line: what the operator "
        "reads first, and what dead letters are grouped by."
    )
    verdict = models.TextField(
        blank=True, help_text="Why the engine dead-lettered it, where that is not the error "
        "itself (deliveries that kept dying)."
    )
    received_message = models.TextField(
        blank=True, help_text="The message a refused delivery carried, where it differed "
        "from the message as sent."
    )
    failure_class = models.CharField(max_length=16, choices=FailureClass.choices, blank=True)
    discard_reason = models.TextField(blank=True)
    planned_at = models.DateTimeField(default=timezone.now)
    enqueued_at = models.DateTimeField(null=True, blank=True)
    last_delivery_at = models.DateTimeField(null=True, blank=True)
    committed_at = models.DateTimeField(null=True, blank=True)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    dead_lettered_at = models.DateTimeField(null=True, blank=True)
    discarded_at = models.DateTimeField(null=True, blank=True)
    reconciled_at = models.DateTimeField(null=True, blank=True)
    reconciles = models.PositiveIntegerField(
        default=0, help_text="Times the reconciler re-sent it as lost or never sent."
    )
    history = models.JSONField(
        default=list, blank=True,
        help_text="Its deliveries, oldest first (the last 50): each with when it began, "
                  "the worker (host:pid), and, once it ended, when, its outcome, the rows "
                  "it changed, its in-task retries and its error's line. One without an "
                  "outcome is in progress, or its worker died.",
    )

    class Meta:
        ordering = ["run", "chunk_id"]
        constraints = [models.UniqueConstraint(fields=["run", "chunk_id"],
                                               name="chunk_unique_id_in_run")]
        indexes = [
            models.Index(fields=["run", "state"]), models.Index(fields=["state"]),
            # The observed field of the chunk purge (see Run's).
            models.Index(fields=["planned_at"], name="chunk_planned_at"),
            # The overview's rows per minute over the last hour, read every few seconds.
            models.Index(fields=["committed_at"], condition=models.Q(committed_at__isnull=False),
                         name="chunk_committed_at"),
        ]

    def __str__(self) -> str:
        return f"chunk #{self.chunk_id} of run {short_id(self.run_id)}"

    @property
    def rows_changed(self) -> int:
        """What the chunk's statement changed: rows deleted, or updated."""
        return rows_changed(self.__dict__)

    @property
    def failure_summary(self) -> str:
        """What went wrong in one line: the error's own line, then the engine's verdict
        ("OperationalError: canceling statement due to lock timeout; 5 deliveries
        started without completing (limit 5)"); marked as past ("earlier: ...") once
        the chunk committed after all (requeued, then done)."""
        verdict = self.verdict.strip().splitlines()[0] if self.verdict.strip() else ""
        summary = "; ".join(part for part in (self.cause, verdict) if part)
        return f"earlier: {summary}" if summary and self.state in self.DONE else summary


class OrphanMessage(models.Model):
    """A dead-lettered message that no chunk took: it names no chunk this database
    knows, or it was malformed and named a chunk that had already finished."""

    received_at = models.DateTimeField(default=timezone.now)
    # What the message named, where it could be read.
    run_id = models.UUIDField(null=True, blank=True)
    chunk_id = models.PositiveIntegerField(null=True, blank=True)
    raw = models.TextField()
    error = models.TextField()

    class Meta:
        ordering = ["-received_at"]

    def __str__(self) -> str:
        return f"orphan message {self.pk}"


class Slot(models.Model):
    """One firing of a policy's schedule: the slot ledger.

    Written by the scheduler process when it enqueues the slot's dispatch task (so
    "the scheduler fired" is a fact of its own), then by the dispatch task with what
    the slot did. A fired slot nobody dispatched points at the workers, not the
    scheduler.
    """

    class Outcome(models.TextChoices):
        FIRED = "fired", "Fired, waiting for a worker to dispatch it"
        STARTED = "started", "Started a run"
        COALESCED = "coalesced", "Coalesced into a run in flight"

    policy = models.CharField(max_length=100)
    slot_at = models.DateTimeField(help_text="The time the schedule meant to fire.")
    fired_at = models.DateTimeField(default=timezone.now)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices, default=Outcome.FIRED)
    # No constraint: the ledger purge removes runs in one statement.
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.DO_NOTHING,
                            db_constraint=False, related_name="slots")

    class Meta:
        ordering = ["-slot_at"]
        verbose_name = "schedule slot"
        constraints = [
            models.UniqueConstraint(fields=["policy", "slot_at"], name="slot_unique_per_policy")
        ]
        indexes = [
            models.Index(fields=["policy", "-fired_at"]),
            # The observed field of the slot purge (see Run's).
            models.Index(fields=["fired_at"], name="slot_fired_at"),
        ]

    def __str__(self) -> str:
        return f"{self.policy} slot {self.slot_at.isoformat()}"


class ScheduleInstall(models.Model):
    """When a policy's schedule was installed or its cron last changed: no slot before
    this can have been missed."""

    policy = models.CharField(max_length=100, unique=True)
    cron = models.CharField(max_length=100)
    installed_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.policy} ({self.cron}) since {self.installed_at.isoformat()}"


class CleanupOverview(Run):
    """The admin's "Cleanup overview" page; a proxy so the admin index links to it."""

    class Meta:
        proxy = True
        verbose_name = "Cleanup overview"
        verbose_name_plural = "Cleanup overview"


class Total(models.Model):
    """The totals of a policy's ledger (``family`` "policy") or of an event name's
    outbox (``family`` "event"): counters that only grow and keep what the purges
    delete, and a policy's gauges (its chunks per state, its runs running). Counted by
    the database as each change commits (cleanup/sql/totals_v1.sql), so /metrics reads
    these few rows however large the ledger and the outbox grow."""

    family = models.CharField(max_length=16)
    subject = models.CharField(max_length=100)
    figures = models.JSONField(default=dict)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["family", "subject"], name="total_unique_subject")
        ]

    def __str__(self) -> str:
        return f"{self.family} {self.subject}"
