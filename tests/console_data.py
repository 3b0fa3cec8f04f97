"""A console's worth of realistic data, for measuring the admin lists as an operator sees them.

Large tables (7-digit ids, 6-digit counts), runs in every state and of every trigger
(a replay among them), durations from seconds to hours, the longest policy name,
dead letters with long causes and tracebacks, schedule slots fired, started and
coalesced, seat holds and reminders in every state with long learner refs, reminder
attempts with real Message-IDs, orphan messages, and a few rows written by hand in SQL
with states the code does not know (``HELD``, ``bogus``).

Rows are bulk-inserted as the engine would have left them; nothing is dispatched.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connection
from django.utils import timezone

from cleanup.models import Chunk, OrphanMessage, Run, Slot
from reservations.models import Reminder, ReminderAttempt, SeatHold, Section, Tenant
from reservations.policies import EXPIRE_HOLDS, MARK_REMINDERS_READY, PURGE_REMINDERS

# Ids as a table that has been in production for a while has them.
FIRST_HOLD_ID = 4_812_337
FIRST_REMINDER_ID = 3_905_118
FIRST_ATTEMPT_ID = 9_120_554
FIRST_CHUNK_ID = 2_744_019

TENANTS = [
    "Universidad Nacional de Educación a Distancia — Formación Permanente",
    "Technische Universität München, School of Computation, Information and Technology",
    "Northern Lakes Community College",
]
SECTIONS = [
    "BIO-2041 Cellular and Molecular Biology, Section 003 (Spring, evening cohort)",
    "CS-101 Introduction to Programming",
    "Weiterbildung Datenbanksysteme: Transaktionen, Sperren und MVCC (Blockkurs)",
]
# Single words as long as an identity provider makes them: nowhere to wrap.
LEARNERS = [
    "urn:lms:learner:7f3c9a1e-2b4d-4c8e-9a6f-0d1e2f3a4b5c@sso.tum.example.de",
    "maria.fernandez-villanueva.2019@alumnos.uned.example.es",
    "learner-48213",
]
LOCK_TIMEOUT = "OperationalError: canceling statement due to lock timeout"
FK_VIOLATION = (
    'IntegrityError: update or delete on table "reservations_seathold" violates foreign key '
    'constraint "reservations_reminder_hold_id_fk_reservations_seathold_id" on table '
    '"reservations_reminder"'
)
REFUSED = ("550 5.1.1 <maria.fernandez-villanueva.2019@alumnos.uned.example.es>: "
           "Recipient address rejected: User unknown in virtual mailbox table")
POISON_VERDICT = "5 deliveries started without completing (a worker died in each)"
BAD_VERSION = "MessageError: unknown message version 99 (this worker reads version 1)"


@dataclass
class ConsoleData:
    """What was built, for tests to look for."""

    runs: dict[str, Run] = field(default_factory=dict)
    dead_letters: list[Chunk] = field(default_factory=list)
    unknown_hold_id: int = 0
    unknown_reminder_id: int = 0


def traceback_text(cause: str) -> str:
    """A worker's traceback ending in ``cause``, with PostgreSQL's context after it."""
    return (
        "Traceback (most recent call last):\n"
        '  File "/srv/app/cleanup/engine/worker.py", line 212, in apply_chunk\n'
        "    changed = policy.mutate(queryset)\n"
        '  File "/srv/app/.venv/lib/python3.12/site-packages/django/db/models/query.py", '
        "line 1195, in delete\n"
        "    collector.delete()\n"
        f"django.db.utils.{cause}\n"
        'CONTEXT:  while deleting tuple (48213,7) in relation "reservations_seathold"\n'
    )


def _start_sequence(model, first_id: int) -> None:
    table = model._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute("SELECT setval(pg_get_serial_sequence(%s, 'id'), %s, false)",
                       [table, first_id])


def build(now: datetime | None = None) -> ConsoleData:
    """Write the whole data set; ``now`` anchors every instant (default: the clock)."""
    now = now or timezone.now()
    data = ConsoleData()
    tenants = [Tenant.objects.create(name=name) for name in TENANTS]
    sections = [Section.objects.create(tenant=tenant, title=title, capacity=12_000)
                for tenant, title in zip(tenants, SECTIONS, strict=True)]
    _holds_and_reminders(data, sections, now)
    _attempts(tenants, now)
    _runs(data, now)
    _slots(data, now)
    _orphans(data, now)
    return data


def _holds_and_reminders(data: ConsoleData, sections: list[Section], now: datetime) -> None:
    _start_sequence(SeatHold, FIRST_HOLD_ID)
    _start_sequence(Reminder, FIRST_REMINDER_ID)
    kinds = [  # status, expires in, reminder state, due in
        ("held", timedelta(minutes=14), "pending", timedelta(minutes=4)),
        ("held", timedelta(minutes=3), "pending", -timedelta(minutes=7)),  # overdue
        ("held", timedelta(minutes=6), "ready", -timedelta(minutes=4)),
        ("held", -timedelta(hours=2, minutes=13), "sent", -timedelta(hours=2, minutes=23)),
        ("confirmed", timedelta(days=3), "cancelled", timedelta(days=3)),
        ("held", timedelta(minutes=8), "sending", -timedelta(minutes=2)),
        ("held", timedelta(minutes=5), "failed", -timedelta(minutes=5)),
    ]
    holds = []
    for n in range(35):
        status, expires_in, _, _ = kinds[n % len(kinds)]
        section = sections[n % len(sections)]
        holds.append(SeatHold(
            tenant_id=section.tenant_id, section=section, learner_ref=LEARNERS[n % 3],
            status=status, expires_at=now + expires_in, created_at=now - timedelta(hours=3),
            updated_at=now - timedelta(minutes=n)))
    holds = SeatHold.objects.bulk_create(holds)
    reminders = []
    for n, hold in enumerate(holds):
        _, _, state, due_in = kinds[n % len(kinds)]
        reminders.append(Reminder(
            tenant_id=hold.tenant_id, hold_id=hold.pk, learner_ref=hold.learner_ref,
            state=state, due_at=now + due_in,
            ready_at=now - timedelta(minutes=3) if state != "pending" else None,
            claimed_at=now - timedelta(seconds=40) if state == "sending" else None,
            sent_at=now - timedelta(hours=2, minutes=22) if state == "sent" else None,
            attempts={"sending": 1, "sent": 1, "failed": 3}.get(state, 0),
            failure="refused" if state == "failed" else "",
            last_error=REFUSED if state == "failed" else "",
            created_at=now - timedelta(hours=3), updated_at=now - timedelta(minutes=n)))
    Reminder.objects.bulk_create(reminders)
    # Written by hand in SQL, past the model's choices: the lists must still show them.
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO reservations_seathold (tenant_id, section_id, learner_ref, status, "
            "expires_at, created_at, updated_at) VALUES (%s, %s, %s, 'HELD', %s, %s, %s) "
            "RETURNING id",
            [sections[0].tenant_id, sections[0].pk, LEARNERS[0], now, now, now])
        data.unknown_hold_id = cursor.fetchone()[0]
        cursor.execute(
            "INSERT INTO reservations_reminder (tenant_id, hold_id, learner_ref, due_at, state, "
            "created_at, updated_at) VALUES (%s, %s, %s, %s, 'bogus', %s, %s) RETURNING id",
            [sections[0].tenant_id, data.unknown_hold_id, LEARNERS[0], now, now, now])
        data.unknown_reminder_id = cursor.fetchone()[0]


def _attempts(tenants: list[Tenant], now: datetime) -> None:
    _start_sequence(ReminderAttempt, FIRST_ATTEMPT_ID)
    attempts = []
    for n in range(30):
        hold_id = FIRST_HOLD_ID + 3 + 5 * n
        sent_at = now - timedelta(days=45 - n, minutes=7 * n)
        stamp = sent_at.strftime("%Y%m%dT%H%M%SZ")
        attempts.append(ReminderAttempt(
            tenant=tenants[n % len(tenants)], hold_id=hold_id, learner_ref=LEARNERS[n % 3],
            channel=("email", "sms", "push-notification")[n % 3], sent_at=sent_at,
            message_id=f"<reminder-{hold_id}-{stamp}.{uuid.uuid4().hex}@reservations.example.edu>"))
    ReminderAttempt.objects.bulk_create(attempts)


def _run(now: datetime, policy: str, state: str, *, took: timedelta | None,
         ago: timedelta, trigger: str = "schedule", scheme: str = "items",
         candidates: int = 0, planned_all: bool = True, **extra) -> Run:
    created = now - ago
    return Run.objects.create(
        policy=policy, dispatch_key=f"{policy}:{created.isoformat()}", cutoff=created,
        scheme=scheme, state=state, trigger=trigger, candidates=candidates,
        planned_all=planned_all, window=4, chunk_size=1000, next_chunk_size=1000,
        created_at=created, finished_at=None if took is None else created + took,
        parameters={"sent_before": (created - timedelta(days=30)).isoformat()}
        if policy == PURGE_REMINDERS else {}, **extra)


def _chunks(run: Run, counts: list[tuple[str, int]], rows: int, *, update: bool = False,
            first: int = 1, failures: dict[int, tuple[str, str, str]] | None = None) -> None:
    """``counts``: how many chunks of each state, in order; ``failures`` by chunk number:
    (failure class, cause, verdict)."""
    chunks, number = [], first
    failures = failures or {}
    for state, how_many in counts:
        for _ in range(how_many):
            done = state in ("committed", "acknowledged")
            at = run.created_at + timedelta(seconds=3 * number)
            failure_class, cause, verdict = failures.get(number, ("", "", ""))
            if state in ("retrying", "dead_lettered") and not cause:
                failure_class, cause = "transient", LOCK_TIMEOUT
            message = {"version": 1, "run_id": str(run.pk), "chunk_id": number,
                       "policy": run.policy, "cutoff": run.cutoff.isoformat(),
                       "start_id": FIRST_HOLD_ID + rows * number,
                       "end_id": FIRST_HOLD_ID + rows * (number + 1)}
            chunks.append(Chunk(
                run=run, chunk_id=number, state=state, message=message, planned_rows=rows,
                deliveries={"dead_lettered": 5, "retrying": 3}.get(state, 1 if done else 0),
                deliveries_completed=1 if done else 0,
                rows_deleted=0 if update or not done else rows,
                rows_updated=rows if update and done else 0,
                failure_class=failure_class, cause=cause, verdict=verdict,
                last_error=traceback_text(cause) if cause else "",
                dead_letters=1 if state == "dead_lettered" else 0,
                planned_at=at, enqueued_at=at if state != "planned" else None,
                last_delivery_at=at + timedelta(seconds=1) if state != "planned" else None,
                committed_at=at + timedelta(seconds=2) if done else None,
                acknowledged_at=at + timedelta(seconds=2) if state == "acknowledged" else None,
                dead_lettered_at=at + timedelta(minutes=5) if state == "dead_lettered" else None,
                discarded_at=at + timedelta(hours=1) if state == "discarded" else None,
                discard_reason="rows moved to the archive by hand" if state == "discarded"
                else ""))
            number += 1
    Chunk.objects.bulk_create(chunks)


def _runs(data: ConsoleData, now: datetime) -> None:
    _start_sequence(Chunk, FIRST_CHUNK_ID)
    runs = data.runs
    # 312,500 rows of reminder attempts over 2.3 hours, one tenant's range at a time.
    runs["purged"] = run = _run(now, PURGE_REMINDERS, "completed", scheme="range",
                                took=timedelta(hours=2, minutes=18), ago=timedelta(hours=5),
                                candidates=312_500, chunks_planned=125)
    _chunks(run, [("acknowledged", 124), ("committed", 1)], 2_500)
    # A big expiry still under way: 184,233 candidates so far, planning as it goes.
    runs["running"] = run = _run(now, EXPIRE_HOLDS, "running", took=None,
                                 ago=timedelta(minutes=47), candidates=184_233,
                                 chunks_planned=190, planned_all=False)
    _chunks(run, [("acknowledged", 120), ("committed", 30), ("enqueued", 4),
                  ("retrying", 2), ("planned", 34)], 1_000)
    # The longest policy name, an update policy, 6-digit rows updated over 42 minutes.
    runs["marked"] = run = _run(now, MARK_REMINDERS_READY, "completed",
                                took=timedelta(minutes=42), ago=timedelta(hours=1),
                                candidates=104_876, chunks_planned=105)
    _chunks(run, [("acknowledged", 105)], 1_000, update=True)
    # Dead letters of every kind, with long causes.
    runs["dead"] = run = _run(now, EXPIRE_HOLDS, "completed_with_dead_letters",
                              took=timedelta(minutes=4, seconds=31), ago=timedelta(hours=3),
                              candidates=128_004, chunks_planned=130, trigger="command")
    failures = {127: ("transient", LOCK_TIMEOUT, ""), 128: ("error", FK_VIOLATION, ""),
                129: ("poison", LOCK_TIMEOUT, POISON_VERDICT), 130: ("malformed", BAD_VERSION,
                                                                      "")}
    _chunks(run, [("acknowledged", 125), ("discarded", 1), ("dead_lettered", 4)], 1_000,
            failures=failures)
    data.dead_letters = list(run.chunks.filter(state="dead_lettered"))
    # Its replay with the same cutoff, started from the admin, finished in seconds.
    runs["replay"] = run = _run(now, EXPIRE_HOLDS, "completed", trigger="replay",
                                took=timedelta(seconds=12.4), ago=timedelta(hours=2),
                                candidates=4_000, chunks_planned=4, replay_of=runs["dead"])
    _chunks(run, [("acknowledged", 4)], 1_000)
    # Cancelled by an operator part way.
    runs["cancelled"] = run = _run(now, PURGE_REMINDERS, "cancelled", scheme="range",
                                   trigger="admin", took=timedelta(minutes=17),
                                   ago=timedelta(hours=7), candidates=250_000,
                                   chunks_planned=100, planned_all=False)
    _chunks(run, [("acknowledged", 60), ("cancelled", 40)], 2_500)
    # A day-long run, and one that found nothing (hidden by default).
    runs["long"] = run = _run(now, MARK_REMINDERS_READY, "completed", trigger="command",
                              took=timedelta(days=1, hours=3), ago=timedelta(days=2),
                              candidates=999_999, chunks_planned=1)
    _chunks(run, [("acknowledged", 1)], 999_999, update=True)
    runs["empty"] = _run(now, EXPIRE_HOLDS, "completed", took=timedelta(seconds=0.2),
                         ago=timedelta(minutes=1), candidates=0, chunks_planned=0)


def _slots(data: ConsoleData, now: datetime) -> None:
    slots = []
    for n in range(12):
        slot_at = now.replace(second=0, microsecond=0) - timedelta(minutes=n)
        for policy, run in ((EXPIRE_HOLDS, data.runs["running"]),
                            (MARK_REMINDERS_READY, data.runs["marked"])):
            fired = n == 0  # the latest slot: fired, no worker has dispatched it yet
            slots.append(Slot(
                policy=policy, slot_at=slot_at, fired_at=slot_at + timedelta(seconds=0.4),
                dispatched_at=None if fired else slot_at + timedelta(seconds=1.7),
                outcome="fired" if fired else ("started" if n == 11 else "coalesced"),
                run=None if fired else run))
    slots.append(Slot(policy=PURGE_REMINDERS, slot_at=now - timedelta(hours=5),
                      fired_at=now - timedelta(hours=5), outcome="started",
                      dispatched_at=now - timedelta(hours=5), run=data.runs["purged"]))
    Slot.objects.bulk_create(slots)


def _orphans(data: ConsoleData, now: datetime) -> None:
    items = [[FIRST_HOLD_ID + n, (now - timedelta(hours=1)).isoformat()] for n in range(400)]
    message = {"version": 1, "run_id": str(uuid.uuid4()), "chunk_id": 12_044,
               "policy": EXPIRE_HOLDS, "cutoff": now.isoformat(), "items": items}
    OrphanMessage.objects.bulk_create([
        OrphanMessage(received_at=now - timedelta(minutes=9), run_id=message["run_id"],
                      chunk_id=12_044, raw=json.dumps(message),
                      error=f"no chunk #12044 of run {message['run_id']} in this database"),
        OrphanMessage(received_at=now - timedelta(hours=26), raw='{"version": 7, "payload": '
                      + json.dumps("x" * 600) + "}", error=BAD_VERSION),
        OrphanMessage(received_at=now - timedelta(days=3), raw="not json at all <<<>>>",
                      error="MessageError: the message is not JSON: Expecting value: line 1 "
                      "column 1 (char 0)"),
    ])
