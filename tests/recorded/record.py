"""Write tests/recorded/ from the git history; run by hand, never by the tests:

    DJANGO_SETTINGS_MODULE=tests.settings .venv/bin/python -m tests.recorded.record

Each message is built by the message module of the commit that wrote it (``git show``),
from fixed ids and instants; its envelope is what django-q2's ``async_task`` builds from
the call that release made (its ``CHUNK_TASK``, the message, ``group=run id``), with the
task's id, name and start made fixed; so is the one other task the engine queues (a held
policy's recheck, ``tasks/``). From every commit (tests/recorded/history.py):
``task_paths.json``, each dotted path a release queued a task under or installed a
schedule for, and ``schedules.json``, each Schedule row ``cleanup_schedule`` installed.

Only reads git; run it from a checkout whose history holds the commits named here.
"""

from __future__ import annotations

import json
import re
import sys
import types
import uuid
from datetime import UTC, datetime, timedelta, timezone

import django

django.setup()

from django_q.brokers import Broker  # noqa: E402  (needs the settings above)
from django_q.signing import SignedPackage  # noqa: E402
from django_q.tasks import async_task  # noqa: E402

from tests.recorded import HERE, MESSAGES  # noqa: E402
from tests.recorded.history import (  # noqa: E402
    ROOT,
    constants,
    full,
    record_schedules,
    record_task_paths,
    source,
)

TENANT = 7001
# What each era's message module was called, and where its transport named the task.
MESSAGE_MODULE = {"cleanup/messages.py", "cleanup/engine/messages.py"}
TASK_CONSTANT = re.compile(r'^(\w+_TASK) = "([\w.]+)"', re.M)


def message_module(commit: str) -> types.ModuleType:
    """The message module exactly as ``commit`` had it."""
    path, text = source(commit, *sorted(MESSAGE_MODULE))
    name = f"recorded_messages_{commit}"
    module = types.ModuleType(name)
    module.__file__ = f"{commit}:{path}"
    sys.modules[name] = module  # dataclasses look their module up
    exec(compile(text, module.__file__, "exec"), module.__dict__)  # noqa: S102
    return module


def chunk_task(commit: str) -> str:
    """The CHUNK_TASK ``commit``'s transport (or, before it had one, dispatch) sent."""
    _, text = source(commit, "cleanup/engine/transport.py", "cleanup/transport.py",
                     "cleanup/dispatch.py")
    return dict(TASK_CONSTANT.findall(text))["CHUNK_TASK"]


class Captured(Broker):
    """A broker that keeps what django-q2 would have written to its queue."""

    def __init__(self):
        super().__init__(list_key="recorded")
        self.packages: list[str] = []

    def enqueue(self, task) -> str:
        self.packages.append(task)
        return "recorded"


def envelope(name: str, func: str, message: dict, started: datetime) -> dict:
    """The task django-q2 queued for a chunk (as ``transport.send`` calls it), as JSON."""
    broker = Captured()
    async_task(func, message, group=message["run_id"], broker=broker)
    task = SignedPackage.loads(broker.packages[0])
    task.update(id=uuid.uuid5(uuid.NAMESPACE_URL, name).hex, name=f"recorded-{name}",
                started=started.isoformat())
    task["args"] = list(task["args"])  # a tuple in the pickle; JSON has lists
    return task


class RunLike:
    """What a message module from 83a6297 on reads off a run."""

    def __init__(self, run_id, policy: str, cutoff: datetime, parameters: dict):
        self.id, self.policy, self.cutoff, self.parameters = run_id, policy, cutoff, parameters


def run_id(n: int) -> uuid.UUID:
    return uuid.UUID(f"00000000-0000-4000-8000-{n:012d}")


def iso(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def as_planned(value: datetime) -> str:
    """An observed value as to_char (974f4e9) and ObservedText (83a6297) wrote it."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f+00:00")


def ledger(message: dict, *, scheme: str, planned_rows: int, parameters: dict | None = None,
           trigger: str = "command", planned_all: bool = True, frontier=None,
           span: tuple[int, int] | None = None, chunk_id: int = 1) -> dict:
    """The Run and Chunk rows the release left for the message (after ``migrate``: a run
    from before 0005 is planned_all, and one from before 0003 froze no parameters)."""
    cutoff = datetime.fromisoformat(message["cutoff"])
    planned_at = (cutoff + timedelta(seconds=1)).astimezone(UTC).isoformat()
    slot = cutoff.replace(second=0, microsecond=0).isoformat()
    key = (f"schedule:{message['policy']}:{slot}" if trigger == "schedule"
           else f"command:{uuid.uuid5(uuid.NAMESPACE_URL, message['run_id'])}")
    return {
        "run": {
            "id": message["run_id"], "policy": message["policy"], "dispatch_key": key,
            "cutoff": message["cutoff"], "parameters": parameters or {}, "scheme": scheme,
            "trigger": trigger, "candidates": planned_rows, "chunks_planned": chunk_id,
            "planned_all": planned_all, "frontier": frontier,
            "span_start": span[0] if span else None, "span_end": span[1] if span else None,
            "created_at": planned_at,
        },
        "chunk": {"chunk_id": chunk_id, "state": "enqueued", "planned_rows": planned_rows,
                  "planned_at": planned_at, "enqueued_at": planned_at},
    }


def write(name: str, *, about: str, commit: str | None, written: tuple[str, str | None],
          message: dict, ledger_rows: dict, func_from: str) -> None:
    """One file: the message as queued (its envelope) and the ledger rows beside it."""
    started = datetime.fromisoformat(ledger_rows["chunk"]["enqueued_at"])
    built_by = "reconstructed (no commit wrote it)"
    if commit:
        built_by = f"{full(commit)}:{source(commit, *sorted(MESSAGE_MODULE))[0]}"
    document = {
        "about": about,
        "built_by": built_by,
        "written_from": full(written[0]) if written[0] else None,
        "written_until": full(written[1]) if written[1] else None,
        "task": envelope(name, chunk_task(func_from), message, started),
        "ledger": ledger_rows,
    }
    path = MESSAGES / f"{name}.json"
    path.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {path.relative_to(ROOT)}")


def record_messages() -> None:
    MESSAGES.mkdir(exist_ok=True)
    v2, v2_text, v3, v3_whole, v4 = (message_module(c) for c in
                                     ("ddf2fc3", "974f4e9", "83a6297", "12f7b4d", "6e8f080"))
    head = message_module("HEAD")

    # Version 1: the seed's contract (batch_id), now refused as older than the previous
    # version; no commit ever wrote it. The v2 builder's items, renamed.
    cutoff = iso(2026, 11, 28, 12, 0)
    message = v2.items_message(run_id(100), 1, "expire-holds", cutoff, [
        (101, iso(2026, 11, 28, 11, 0)), (102, iso(2026, 11, 28, 11, 30, 0, 500_000)),
        (103, iso(2026, 11, 28, 11, 45))])
    message = {("batch_id" if k == "chunk_id" else k): v for k, v in message.items()}
    message["version"] = 1
    write("v1-items", about="Version 1 (the seed's batch_id), an items chunk of expire-holds",
          commit=None, written=(None, None), message=message, func_from="ddf2fc3",
          ledger_rows=ledger(message, scheme="items", planned_rows=3))

    # Version 2, observed values as Python's isoformat() of the ORM's datetimes (no
    # microseconds when they are zero), the cutoff with the offset the operator gave.
    cutoff = datetime(2026, 11, 29, 23, 0, tzinfo=timezone(timedelta(hours=2)))
    message = v2.items_message(run_id(200), 1, "expire-holds", cutoff, [
        (201, iso(2026, 11, 29, 20, 15)), (202, iso(2026, 11, 29, 20, 30, 0, 250_000)),
        (203, iso(2026, 11, 29, 20, 45))])
    write("v2-items", about="Version 2 items chunk of expire-holds: observed values from "
          "Python's isoformat(), a cutoff given with its offset (+02:00)",
          commit="ddf2fc3", written=("ddf2fc3", "974f4e9"), message=message,
          func_from="ddf2fc3", ledger_rows=ledger(message, scheme="items", planned_rows=3))

    cutoff = datetime(2026, 11, 30, 6, 0, 0, 123_456, tzinfo=UTC)
    message = v2_text.items_message(run_id(250), 1, "expire-holds", cutoff, [
        (251, as_planned(iso(2026, 11, 30, 5, 10))),
        (252, as_planned(iso(2026, 11, 30, 5, 20, 0, 500_000))),
        (253, as_planned(iso(2026, 11, 30, 5, 30)))])
    write("v2-items-observed-as-text", about="Version 2 items chunk of expire-holds: "
          "observed values as planning's to_char text (microseconds always)",
          commit="974f4e9", written=("974f4e9", "83a6297"), message=message,
          func_from="974f4e9", ledger_rows=ledger(message, scheme="items", planned_rows=3))

    cutoff = iso(2026, 11, 29, 22, 15)
    message = v2.range_message(run_id(260), 1, "purge-reminder-attempts", cutoff, TENANT,
                               2601, 2605)
    write("v2-range-tenant", about="Version 2 range chunk of purge-reminder-attempts in one "
          "tenant (tenant_id), from before its retention deadline was frozen with the run",
          commit="ddf2fc3", written=("ddf2fc3", "83a6297"), message=message,
          func_from="ddf2fc3", ledger_rows=ledger(message, scheme="range", planned_rows=2))

    cutoff = iso(2026, 11, 29, 22, 30)
    message = v2.range_message(run_id(270), 1, "expire-holds", cutoff, TENANT, 2701, 2706)
    write("v2-range-tenant-expire-holds", about="Version 2 range chunk of expire-holds in "
          "one tenant (tenant_id), from when expire-holds partitioned its ranges by tenant",
          commit="ddf2fc3", written=("ddf2fc3", "83a6297"), message=message,
          func_from="ddf2fc3", ledger_rows=ledger(message, scheme="range", planned_rows=2))

    # Version 3: parameters in every message; observed values as ObservedText (text with
    # microseconds, or PostgreSQL's own text such as -infinity). Runs stream from
    # 4195dee: this one has a frontier after its first chunk.
    cutoff = datetime(2026, 12, 1, 8, 30, 0, 654_321, tzinfo=UTC)
    last = as_planned(iso(2026, 12, 1, 8, 10))
    message = v3.items_message(RunLike(run_id(300), "expire-holds", cutoff, {}), 1, [
        (301, "-infinity"), (302, as_planned(iso(2026, 12, 1, 8, 0))), (303, last)])
    year_one = int(datetime(1, 1, 1, tzinfo=UTC).timestamp())
    write("v3-items", about="Version 3 items chunk of expire-holds in a streaming run: "
          "parameters (none for this policy), an observed -infinity as PostgreSQL's text",
          commit="83a6297", written=("83a6297", "6e8f080"), message=message,
          func_from="83a6297",
          ledger_rows=ledger(message, scheme="items", planned_rows=3, trigger="schedule",
                             planned_all=False, frontier={"after": [last, 303]},
                             span=(year_one, int(cutoff.timestamp()) + 1)))

    cutoff = iso(2026, 12, 1, 8, 15)
    parameters = {"sent_before": (cutoff - timedelta(days=30)).isoformat()}
    message = v3.range_message(RunLike(run_id(360), "purge-reminder-attempts", cutoff,
                                       parameters), 1, TENANT, 3601, 3605)
    write("v3-range-tenant", about="Version 3 range chunk of purge-reminder-attempts in one "
          "tenant (tenant_id) with its frozen retention deadline",
          commit="83a6297", written=("83a6297", "6e8f080"), message=message,
          func_from="83a6297",
          ledger_rows=ledger(message, scheme="range", planned_rows=2, parameters=parameters))

    cutoff = iso(2026, 12, 1, 8, 45)
    message = v3.range_message(RunLike(run_id(370), "expire-holds", cutoff, {}), 1, TENANT,
                               3701, 3706)
    write("v3-range-tenant-expire-holds", about="Version 3 range chunk of expire-holds in "
          "one tenant (tenant_id), before expire-holds ranged over the whole table",
          commit="83a6297", written=("83a6297", "12f7b4d"), message=message,
          func_from="83a6297", ledger_rows=ledger(message, scheme="range", planned_rows=2))

    cutoff = iso(2026, 12, 1, 9, 30)
    message = v3_whole.range_message(RunLike(run_id(380), "expire-holds", cutoff, {}), 1,
                                     None, 3801, 3805, partitioned=False)
    write("v3-range-whole-table", about="Version 3 range chunk of expire-holds over the "
          "whole table (no tenant_id)",
          commit="12f7b4d", written=("12f7b4d", "6e8f080"), message=message,
          func_from="12f7b4d", ledger_rows=ledger(message, scheme="range", planned_rows=3))

    # Version 4: a range names its partition "partition".
    cutoff = datetime(2026, 12, 2, 9, 0, 0, 1, tzinfo=UTC)
    message = v4.items_message(RunLike(run_id(400), "expire-holds", cutoff, {}), 1, [
        (401, as_planned(iso(2026, 12, 2, 8, 0))),
        (402, as_planned(iso(2026, 12, 2, 8, 30, 0, 123_456))),
        (403, as_planned(iso(2026, 12, 2, 8, 40)))])
    write("v4-items", about="Version 4 items chunk of expire-holds",
          commit="6e8f080", written=("6e8f080", None), message=message, func_from="6e8f080",
          ledger_rows=ledger(message, scheme="items", planned_rows=3))

    cutoff = iso(2026, 12, 2, 10, 0)
    message = head.items_message(RunLike(run_id(450), "mark-reminders-ready", cutoff, {}), 1, [
        (4501, as_planned(iso(2026, 12, 2, 9, 0))),
        (4502, as_planned(iso(2026, 12, 2, 9, 30))),
        (4503, as_planned(iso(2026, 12, 2, 9, 45)))])
    write("v4-items-update", about="Version 4 items chunk of mark-reminders-ready, an "
          "update policy (it marks due reminders ready)",
          commit="HEAD", written=("fe7bb3a", None), message=message, func_from="HEAD",
          ledger_rows=ledger(message, scheme="items", planned_rows=3))

    cutoff = datetime(2026, 12, 2, 11, 0, 0, 5, tzinfo=UTC)
    parameters = {"stopped_before": (cutoff - timedelta(days=7)).isoformat()}
    task_ids = [uuid.uuid5(uuid.NAMESPACE_URL, f"task-{n}").hex for n in range(3)]
    message = head.items_message(RunLike(run_id(470), "purge-task-results", cutoff,
                                         parameters), 1, [
        (task_ids[0], as_planned(iso(2026, 11, 20, 9, 0))),
        (task_ids[1], as_planned(iso(2026, 11, 21, 9, 0))),
        (task_ids[2], as_planned(iso(2026, 11, 22, 9, 0)))])
    write("v4-items-text-keys", about="Version 4 items chunk of the engine's "
          "purge-task-results: text primary keys (django-q2's task ids), a frozen deadline",
          commit="HEAD", written=("6e8f080", None), message=message, func_from="HEAD",
          ledger_rows=ledger(message, scheme="items", planned_rows=3, parameters=parameters))

    cutoff = iso(2026, 12, 2, 9, 15)
    parameters = {"sent_before": (cutoff - timedelta(days=30)).isoformat()}
    message = v4.range_message(RunLike(run_id(460), "purge-reminder-attempts", cutoff,
                                       parameters), 1, TENANT, 4601, 4605)
    write("v4-range-partition", about="Version 4 range chunk of purge-reminder-attempts in "
          "one tenant (partition) with its frozen retention deadline",
          commit="6e8f080", written=("6e8f080", None), message=message, func_from="6e8f080",
          ledger_rows=ledger(message, scheme="range", planned_rows=2, parameters=parameters))

    cutoff = iso(2026, 12, 2, 9, 45)
    message = v4.range_message(RunLike(run_id(480), "expire-holds", cutoff, {}), 1, None,
                               4801, 4805, partitioned=False)
    write("v4-range-whole-table", about="Version 4 range chunk of expire-holds over the whole "
          "table (no partition)",
          commit="6e8f080", written=("6e8f080", None), message=message, func_from="6e8f080",
          ledger_rows=ledger(message, scheme="range", planned_rows=3))

    # A version this engine does not know: a newer release's, left queued by a rollback.
    cutoff = iso(2026, 12, 2, 12, 0)
    message = head.items_message(RunLike(run_id(500), "expire-holds", cutoff, {}), 1, [
        (501, as_planned(iso(2026, 12, 2, 11, 0))), (502, as_planned(iso(2026, 12, 2, 11, 30)))])
    message["version"] = 5
    write("unknown-version", about="Version 5, which no release wrote yet: a newer "
          "release's message left in the queue by a rollback",
          commit=None, written=(None, None), message=message, func_from="HEAD",
          ledger_rows=ledger(message, scheme="items", planned_rows=2))


def record_recheck() -> None:
    """The one task the engine queues besides chunks: a held policy's recheck."""
    commit = "cd7a6f2"
    _, text = source(commit, "cleanup/engine/window.py")
    broker = Captured()
    async_task(constants(text)["RECHECK_TASK"], "expire-holds", broker=broker)
    task = SignedPackage.loads(broker.packages[0])
    task.update(id=uuid.uuid5(uuid.NAMESPACE_URL, "recheck").hex, name="recorded-recheck",
                started=iso(2026, 12, 2, 13, 0).isoformat(), args=list(task["args"]))
    document = {"about": "A halted policy's recheck task, as window.recheck_later queued it",
                "built_by": f"{full(commit)}:cleanup/engine/window.py", "task": task}
    path = HERE / "tasks" / "recheck-pressure.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    record_messages()
    record_task_paths()
    record_schedules()
    record_recheck()
