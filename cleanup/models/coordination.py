"""What coordinates the engine's processes: the workers' heartbeats, the policies'
halts, the leases on work, the steps a lock blocks and the backlogs' last exact
readings."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class WorkerHeartbeat(models.Model):
    """The last time a worker of a cluster ran the heartbeat task.

    The heartbeat travels through the queue like any task, so a cluster that has
    stopped taking work stops beating, while an idle one keeps beating. A cluster
    stopped as a deploy stops it (SIGTERM) also says so at once: ``stopped_at``.
    """

    host = models.CharField(max_length=255)
    cluster = models.CharField(max_length=100)
    pid = models.PositiveIntegerField()
    beat_at = models.DateTimeField()
    stopped_at = models.DateTimeField(
        null=True, blank=True,
        help_text="When the cluster last stopped cleanly; empty once a worker of it beats "
                  "again.")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["host", "cluster"], name="heartbeat_unique_cluster")
        ]

    def __str__(self) -> str:
        return f"{self.cluster}@{self.host}"


class Halt(models.Model):
    """A time a policy planned and sent nothing new: paused by an operator, halted by the
    database's pressure, or failing. Open while ``ended_at`` is empty; chunks in flight
    finish meanwhile, and runs stay running."""

    PAUSED = "paused"
    # Most of a policy's last chunks were dead-lettered (cleanup.engine.halts).
    FAILING = "failing"
    # The halts only an operator ends (a resume); the pressure's end by themselves.
    ENDED_BY_OPERATOR = (PAUSED, FAILING)

    policy = models.CharField(max_length=100)
    reason = models.CharField(max_length=64)  # "paused", "failing", a pressure's
    detail = models.TextField(blank=True)  # why, in words: the operator's reason
    # A failing halt's: the most common cause of the dead letters (what the alert says).
    cause = models.CharField(max_length=255, blank=True, default="")
    value = models.FloatField(null=True, blank=True)  # a measured pressure, and its limit
    limit = models.FloatField(null=True, blank=True)
    actor = models.CharField(max_length=150, blank=True)  # who began it
    began_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)
    ended_by = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["-began_at"]
        # Its index also finds a policy's open halts (policy leads).
        constraints = [models.UniqueConstraint(
            fields=["policy", "reason"], condition=models.Q(ended_at__isnull=True),
            name="halt_one_open_per_reason")]

    def __str__(self) -> str:
        return f"{self.policy} {self.reason} since {self.began_at:%Y-%m-%d %H:%M:%S}"


class Lease(models.Model):
    """A claim on work that lapses on the database's clock unless its owner renews it
    (cleanup.engine.leases): a row, never a session lock, which a pooler's server
    connection would keep past a dead or frozen owner."""

    name = models.CharField(max_length=200, primary_key=True)  # run:<id>, recheck:<policy>
    owner = models.CharField(max_length=200)  # host:pid:token of the process
    taken_at = models.DateTimeField()
    expires_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.name} held by {self.owner} until {self.expires_at:%H:%M:%S}"


class BlockedStep(models.Model):
    """A step (a policy's dispatch, the reconciler, the publisher, a host's task) that
    gave up on a lock at its bound, and the session found holding a table lock that
    blocks it. Kept, and counted, until the step next gets through
    (cleanup.engine.steps)."""

    step = models.CharField(max_length=100)
    policy = models.CharField(max_length=100, blank=True, default="")
    since = models.DateTimeField(help_text="Its first give-up since it last got through.")
    last_at = models.DateTimeField()
    times = models.PositiveIntegerField(default=1)
    # The blocking session as pg_stat_activity showed it; empty when none was found (a
    # row lock, or a lock released since).
    blocker_pid = models.IntegerField(null=True, blank=True)
    blocker_application = models.CharField(max_length=255, blank=True, default="")
    blocker_lock = models.CharField(max_length=255, blank=True, default="")
    blocker_query = models.TextField(blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["step", "policy"], name="blocked_step_unique")
        ]

    def __str__(self) -> str:
        return f"{self.step} of {self.policy}" if self.policy else self.step

    @property
    def blocker(self) -> str:
        """The blocking session in a few words: ``nightly-report (pid 4242)``."""
        if self.blocker_pid is None:
            return "no session found (a row lock, or a lock released since)"
        return f"{self.blocker_application or 'no application name'} (pid {self.blocker_pid})"


class BacklogReading(models.Model):
    """The last exact reading of a backlog (a policy's, a host's), where every process
    sees it: a reading past its budget repeats the newest of them, whichever web worker
    took it (cleanup.observability.backlog)."""

    key = models.CharField(max_length=200, primary_key=True)
    rows = models.PositiveIntegerField()
    oldest_observed = models.DateTimeField(null=True, blank=True)
    read_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.key}: {self.rows} at {self.read_at.isoformat()}"
