"""The engine's own cleanup policies: it purges its ledger (runs, chunks, the trigger
ledger's slots), the outbox's settled events and django-q2's results with the same
replay-safe pipeline it offers the host project."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Q

from cleanup.conf import conf
from cleanup.models import Chunk, Event, Run
from cleanup.policies import ITEMS, RANGE, Policy, register_policy

PURGE_CHUNKS = "purge-cleanup-chunks"
PURGE_RUNS = "purge-cleanup-runs"
PURGE_TASK_RESULTS = "purge-task-results"
PURGE_SLOTS = "purge-cleanup-slots"
PURGE_EVENTS = "purge-cleanup-events"
# What the event purge takes: dead events wait for an operator, pending ones for delivery.
SETTLED_FOR_GOOD = (Event.State.DELIVERED, Event.State.DISCARDED)
# Runs go a day after their chunks, so the chunk purge has emptied them by then.
RUN_MARGIN = timedelta(days=1)


def ledger_retention() -> timedelta:
    return timedelta(days=conf.LEDGER_RETENTION_DAYS)


def event_retention() -> timedelta:
    return timedelta(days=conf.EVENT_RETENTION_DAYS)


def task_result_retention() -> timedelta:
    return timedelta(days=conf.TASK_RESULT_RETENTION_DAYS)


# Each deadline is derived from the cutoff once, at dispatch, and frozen with the run.
def chunk_deadline(cutoff: datetime) -> dict[str, datetime]:
    return {"planned_before": cutoff - ledger_retention()}


def run_deadline(cutoff: datetime) -> dict[str, datetime]:
    return {"created_before": cutoff - ledger_retention() - RUN_MARGIN}


def slot_deadline(cutoff: datetime) -> dict[str, datetime]:
    return {"fired_before": cutoff - ledger_retention()}


def event_deadline(cutoff: datetime) -> dict[str, datetime]:
    return {"settled_before": cutoff - event_retention()}


def task_result_deadline(cutoff: datetime) -> dict[str, datetime]:
    return {"stopped_before": cutoff - task_result_retention()}


def old_chunks(cutoff: datetime, planned_before: datetime) -> Q:
    return Q(state__in=Chunk.FINISHED, planned_at__lte=planned_before)


def old_runs(cutoff: datetime, created_before: datetime) -> Q:
    return Q(state__in=Run.FINISHED, created_at__lte=created_before)


def old_slots(cutoff: datetime, fired_before: datetime) -> Q:
    return Q(fired_at__lte=fired_before)


def old_events(cutoff: datetime, settled_before: datetime) -> Q:
    return Q(state__in=SETTLED_FOR_GOOD, settled_at__lte=settled_before)


def old_task_results(cutoff: datetime, stopped_before: datetime) -> Q:
    return Q(stopped__lte=stopped_before)


def register_policies() -> None:
    register_policy(Policy(
        name=PURGE_CHUNKS, model_label="cleanup.Chunk", eligible=old_chunks,
        derive=chunk_deadline,
        observed_field="planned_at", partition_field="run", scheme=RANGE, chunk_size=1000,
        schedule="40 * * * *", eligible_after=ledger_retention,
    ))
    register_policy(Policy(
        name=PURGE_RUNS, model_label="cleanup.Run", eligible=old_runs, derive=run_deadline,
        observed_field="created_at", partition_field="policy", scheme=ITEMS, chunk_size=500,
        schedule="50 * * * *", eligible_after=lambda: ledger_retention() + RUN_MARGIN,
    ))
    register_policy(Policy(
        name=PURGE_SLOTS, model_label="cleanup.Slot", eligible=old_slots, derive=slot_deadline,
        observed_field="fired_at", partition_field="policy", scheme=RANGE, chunk_size=1000,
        schedule="45 * * * *", eligible_after=ledger_retention,
    ))
    register_policy(Policy(
        name=PURGE_EVENTS, model_label="cleanup.Event", eligible=old_events,
        derive=event_deadline,
        observed_field="settled_at", partition_field=None, scheme=RANGE, chunk_size=1000,
        schedule="35 * * * *", eligible_after=event_retention,
    ))
    register_policy(Policy(
        name=PURGE_TASK_RESULTS, model_label="django_q.Task", eligible=old_task_results,
        derive=task_result_deadline,
        observed_field="stopped", partition_field="func", scheme=ITEMS, chunk_size=500,
        schedule="55 * * * *", eligible_after=task_result_retention,
    ))
