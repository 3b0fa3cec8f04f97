"""django-q2 signals: the broker's acknowledgement of a chunk, a worker's heartbeat as
it spawns and as it takes a task, a cluster's word that it stopped, and the scheduler's
firing of a slot."""

from __future__ import annotations

from datetime import datetime

import structlog
from django.db import DatabaseError, transaction
from django.dispatch import receiver
from django_q.signals import post_execute, post_spawn, pre_enqueue, pre_execute

from cleanup.engine import messages, transitions
from cleanup.engine.transport import CHUNK_TASK
from cleanup.observability import health
from cleanup.scheduling import slots
from cleanup.scheduling.schedules import DISPATCH_TASK

log = structlog.get_logger("cleanup.receivers")


@receiver(post_execute, dispatch_uid="cleanup.record_acknowledgement")
def record_acknowledgement(sender, task, **kwargs) -> None:
    """Mark a committed chunk acknowledged once django-q2 has acked its message.

    post_execute fires after the ack; a process dying in between leaves the chunk
    committed, which only reads as "awaiting acknowledgement".
    """
    health.record_stop_at_exit()  # this is the cluster's monitor: it exits last
    if task.get("func") != CHUNK_TASK or not task.get("success") or not task.get("args"):
        return
    run_id, chunk_id = messages.identify(task["args"][0])
    if run_id is None or chunk_id is None:
        return
    try:
        transitions.to_acknowledged(run_id, chunk_id)
    except DatabaseError as exc:
        # This runs in django-q2's monitor loop; an error here must not stop it. The
        # chunk stays committed, which reads as "awaiting acknowledgement".
        log.warning("acknowledgement not recorded", run_id=run_id, chunk_id=chunk_id,
                    error=str(exc))


@receiver(post_spawn, dispatch_uid="cleanup.record_worker_spawned")
def record_worker_spawned(sender, proc_name, **kwargs) -> None:
    """Have a worker beat as it spawns: a cluster (re)started takes work at once, and
    says so before its first task."""
    try:
        health.beat_now_and_then()
    except DatabaseError as exc:
        # In django-q2's worker, before its first task: an error here must not kill it.
        log.warning("heartbeat not recorded", error=str(exc))


@receiver(pre_execute, dispatch_uid="cleanup.record_cluster_beat")
def record_cluster_beat(sender, task, **kwargs) -> None:
    """Have a worker that takes a task beat now and then, so every cluster taking work
    shows, whichever took the scheduled heartbeat task."""
    try:
        health.beat_now_and_then()
    except DatabaseError as exc:
        # In django-q2's worker, before the task: an error here must not cost the task.
        log.warning("heartbeat not recorded", error=str(exc))


@receiver(pre_enqueue, dispatch_uid="cleanup.record_slot_fired")
def record_slot_fired(sender, task, **kwargs) -> None:
    """Record a schedule slot in the slot ledger as the scheduler enqueues it.

    This runs in the scheduler process, inside its transaction: the slot is recorded
    exactly when its task is, whether or not a worker ever runs it. An error here
    fails that transaction and the scheduler tries the slot again on its next pass.
    """
    if task.get("func") != DISPATCH_TASK:
        return
    arguments = task.get("kwargs") or {}
    if "policy" in arguments and "scheduled_for" in arguments:
        slot_at = datetime.fromisoformat(arguments["scheduled_for"])
        try:
            # A savepoint: a failure here must not roll back the scheduler's whole pass
            # (every other schedule, the heartbeat). The dispatch task records the slot
            # too, so only the firing time is lost.
            with transaction.atomic():
                slots.record_fire(arguments["policy"], slot_at)
        except DatabaseError as exc:
            log.warning("schedule slot not recorded", policy=arguments["policy"],
                        slot=slot_at.isoformat(), error=str(exc))
