"""A rolling upgrade keeps working: every dotted path an earlier release queued a task
under or installed a schedule for still names a task that runs.

django-q2 stores the function of a queued task, and of a Schedule, as a dotted path
string, and its worker finds it with ``pydoc.locate`` when it runs it: a module moved
without its old path breaks work in flight. The paths are recorded from every commit
(tests/recorded/task_paths.json, schedules.json).
"""

from __future__ import annotations

import ast
import inspect
import json
import pydoc
from datetime import timedelta

import pytest
from django.utils import timezone
from django.utils.module_loading import import_string
from django_q.models import OrmQ, Schedule
from django_q.scheduler import scheduler

from cleanup.models import Run
from tests.delivery import as_django_q2_runs, run_queued
from tests.recorded import HERE, task_paths

PATHS = task_paths()["paths"]
KEPT = sorted(path for path, entry in PATHS.items() if "not_kept_importable" not in entry)
SCHEDULES = json.loads((HERE / "schedules.json").read_text())["schedules"]


@pytest.mark.parametrize("path", KEPT)
def test_every_path_a_release_queued_or_scheduled_still_names_a_task(path):
    located = pydoc.locate(path)  # what django-q2's worker does with the stored path
    assert callable(located), f"{path} no longer names a callable"
    assert import_string(path) is located


def test_only_paths_the_benchmark_alone_queued_were_let_go():
    let_go = {path: entry["roles"] for path, entry in PATHS.items()
              if "not_kept_importable" in entry}
    assert let_go, "the recording names the benchmark's moved tasks"
    for path, roles in let_go.items():
        assert all("/bench/" in role for role in roles), (path, roles)


@pytest.mark.parametrize("row", SCHEDULES, ids=lambda row: row["name"])
def test_every_schedule_a_release_installed_still_calls_its_task_as_it_did(row):
    """Its func is found, and takes the arguments the scheduler passes it: the Schedule's
    kwargs and, where it has one, the slot under its intended_date_kwarg."""
    kwargs = ast.literal_eval(row["kwargs"]) if row["kwargs"] else {}
    if row["intended_date_kwarg"]:
        kwargs[row["intended_date_kwarg"]] = timezone.now().isoformat()
    inspect.signature(pydoc.locate(row["func"])).bind(**kwargs)


# django-q2's scheduler closes the test's connection before it runs, which ends the test's
# wrapping transaction: this test commits for real.
@pytest.mark.django_db(transaction=True)
def test_schedules_an_earlier_release_installed_still_fire_and_run():
    slot = (timezone.now() - timedelta(minutes=5)).replace(second=0, microsecond=0)
    for row in SCHEDULES:
        Schedule.objects.create(
            name=row["name"], func=row["func"], kwargs=row["kwargs"],
            intended_date_kwarg=row["intended_date_kwarg"], schedule_type=Schedule.CRON,
            cron="* * * * *", repeats=-1)
    Schedule.objects.update(next_run=slot)  # due (a cron schedule's save sets the next)

    scheduler()
    done = [run_queued(queued.pk) for queued in OrmQ.objects.order_by("pk")]

    assert sorted(task["group"] for task in done) == sorted(row["name"] for row in SCHEDULES)
    assert [task["func"] for task in done if not task["success"]] == []
    policies = [ast.literal_eval(row["kwargs"])["policy"] for row in SCHEDULES if row["kwargs"]]
    assert set(Run.objects.values_list("dispatch_key", flat=True)) == {
        f"schedule:{policy}:{slot.isoformat()}" for policy in policies}


def test_a_recheck_an_earlier_release_queued_still_runs(db, settings):
    settings.CLEANUP_PRESSURE_CHECK_SECONDS = 0  # one look, half a second
    recorded = json.loads((HERE / "tasks" / "recheck-pressure.json").read_text())

    done = as_django_q2_runs(recorded["task"])

    assert (done["success"], done["result"]) == (True, 0)
