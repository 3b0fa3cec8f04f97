"""One real cleanup cycle through a qcluster, with learners racing it, and its report:
expired holds deleted, due renewal reminders marked ready and sent, replays no-ops, and
seats freed in full sections offered once each to the first learner waiting."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from email import message_from_bytes
from pathlib import Path

from django.db.models import Count
from django.utils import timezone
from django_q.tasks import async_task

from cleanup import Chunk, Event, Run, dispatch, get_policy, replay, run_summary
from cleanup.host import QCluster
from reservations import seeding
from reservations.models import (
    FreedSeat,
    OfferMail,
    Reminder,
    ReminderAttempt,
    SeatHold,
    Section,
    Tenant,
    WaitlistEntry,
)
from reservations.policies import EXPIRE_HOLDS, MARK_REMINDERS_READY, PURGE_REMINDERS
from reservations.reminders import message_id
from reservations.services import confirm_hold, release_hold, reminder_due, renew_hold
from reservations.waitlist import SEAT_FREED

MANAGE = Path(__file__).resolve().parent.parent / "manage.py"
# Where the demo's cluster writes its mails unless told otherwise: in the checkout's
# git-ignored .data/, kept until the next demo empties it.
MAIL_DIR = MANAGE.parent / ".data" / "demo-mail"
# The files Django's file backend writes: "<YYYYmmdd-HHMMSS>-<id>.log"; nothing else in
# the folder is touched.
MAIL_FILE = re.compile(r"\d{8}-\d{6}-\d+\.log")
# Full sections with a waitlist: each has this many seats, all held, and this many
# learners in line; one hold of each expires (cleanup frees it), and one more is
# released by its learner.
WAITLISTED_SECTIONS, WAITLISTED_SEATS, WAITING = 3, 2, 3


@dataclass
class DemoReport:
    runs: list[dict] = field(default_factory=list)
    racing: dict = field(default_factory=dict)
    reminders: dict = field(default_factory=dict)
    waitlist: dict = field(default_factory=dict)
    checks: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(self.checks.values())


def run_demo(*, expired: int, active: int, racers: int, timeout: float,
             say: Callable[[str], None], mail: Path = MAIL_DIR) -> DemoReport:
    """Seed, dispatch the policies, renew and confirm some candidates, let a qcluster work,
    have it send the reminders marked ready (as files in ``mail``, emptied of the
    previous demo's first)."""
    # The waitlists first: a held hold deleted while its section has one writes an event.
    for model in (OfferMail, FreedSeat, WaitlistEntry, Reminder, SeatHold, ReminderAttempt,
                  Section, Tenant):
        model.objects.all().delete()
    seeding.seed(tenants=3, expired=expired, active=active, confirmed=expired // 10,
                 attempts=expired, random_seed=1, progress=lambda *a: None)
    lined_up = seeding.seed_waitlists(sections=WAITLISTED_SECTIONS, seats=WAITLISTED_SEATS,
                                      waiting=WAITING)
    # Time runs out on one seat of each full section: cleanup is to free it.
    expiring = [holds[0] for holds in lined_up]
    SeatHold.objects.filter(pk__in=expiring).update(expires_at=timezone.now()
                                                    - timedelta(seconds=1))
    say(f"Seeded {expired:,} expired and {active:,} active holds, and {len(lined_up)} full "
        f"sections with {WAITING} learners waiting each.")

    holds_run = dispatch(EXPIRE_HOLDS).run
    attempts_run = dispatch(PURGE_REMINDERS).run
    marks_run = dispatch(MARK_REMINDERS_READY).run
    due = _due_active_reminders(marks_run)
    # Learners act after planning and before the workers: their holds are in the
    # messages, and must survive them; a hold renewed after the mark run froze its
    # cutoff keeps its reminder pending, due before the new expiry.
    planned = [pk for pk, _ in holds_run.chunks.get(chunk_id=1).message["items"]
               if pk not in expiring][: 2 * racers]
    renewed = [renew_hold(pk).pk for pk in planned[:racers]]
    confirmed = [confirm_hold(pk).pk for pk in planned[racers:]]
    moved = [Reminder.objects.get(hold_id=renew_hold(r.hold_id).pk) for r in due[:1]]
    # A learner gives a seat of a full section back: freed by the host, not cleanup.
    released = [lined_up[0][1]]
    release_hold(released[0])
    say(f"Dispatched 3 runs; {len(renewed)} candidates renewed and {len(confirmed)} "
        f"confirmed, and {len(moved)} hold with a reminder due renewed, before any "
        "worker ran.")

    mail.mkdir(parents=True, exist_ok=True)
    for path in mail.iterdir():
        if MAIL_FILE.fullmatch(path.name):
            path.unlink()
    env = {**os.environ, "DJANGO_EMAIL_BACKEND": "django.core.mail.backends.filebased.EmailBackend",
           "EMAIL_FILE_PATH": str(mail)}
    cluster = QCluster("demo", env, MANAGE)
    cluster.start()
    runs = [holds_run, attempts_run, marks_run]
    try:
        _wait(lambda: _settled(runs), timeout, "the runs to finish")
        ready = Reminder.objects.filter(state=Reminder.State.READY).count()
        say(f"The runs finished; {ready} reminders marked ready. The sender runs on the "
            "cluster, then the hold run is replayed with its own cutoff.")
        # What the sender's schedule does every minute, now (a host task, run as a step).
        async_task("cleanup.tasks.run_task", name="send-reminders")
        _wait(lambda: not Reminder.objects.filter(state=Reminder.State.READY).exists(),
              timeout, "the sender to take every ready reminder")
        resent = replay(holds_run.pk).resent
        _wait(lambda: _noops(holds_run) >= resent and _settled(runs), timeout,
              "the replayed chunks to be delivered")
        # What the outbox's schedule does every minute: offer the freed seats.
        async_task("cleanup.tasks.publish_events")
        _wait(lambda: not Event.objects.filter(name=SEAT_FREED, state="pending").exists(),
              timeout, "the freed seats to be offered")
    finally:
        cluster.stop(timeout=60)

    policy = get_policy(EXPIRE_HOLDS)
    report = DemoReport(runs=[run_summary(Run.objects.get(pk=r.pk)) for r in runs])
    report.reminders = _reminder_report(due, moved, mail)
    survivors = SeatHold.objects.filter(pk__in=renewed + confirmed).count()
    report.racing = {"renewed": len(renewed), "confirmed": len(confirmed),
                     "survivors": survivors}
    report.checks = {
        "renewed and confirmed holds survived": survivors == len(renewed) + len(confirmed),
        "no hold eligible at the cutoff is left":
            not policy.eligible_rows(holds_run.frozen).exists(),
        "active holds untouched":
            SeatHold.objects.filter(status="held", expires_at__gt=holds_run.cutoff).count()
            >= active,
        "each expired hold deleted once, replays were no-ops":
            report.runs[0]["rows_deleted"]
            == expired + len(expiring) - len(renewed) - len(confirmed)
            and report.runs[0]["noop_deliveries"] >= resent,
        **_reminder_checks(report, marks_run, moved),
    }
    report.waitlist, check = _waitlist_report(expiring, released, mail)
    report.checks[f"{report.waitlist['freed']} freed seats offered once each"] = check
    return report


def _waitlist_report(expiring: list[int], released: list[int],
                     mail: Path) -> tuple[dict, bool]:
    """What the freed seats produced, and whether each was offered once: one event, one
    record, one offer hold, one mail on record and in the folder, to a distinct learner."""
    freed = expiring + released
    events = Event.objects.filter(name=SEAT_FREED, key__in=[f"seathold:{pk}" for pk in freed])
    records = FreedSeat.objects.filter(hold_id__in=freed)
    offered = WaitlistEntry.objects.filter(state=WaitlistEntry.State.OFFERED)
    offer_ids = set(OfferMail.objects.values_list("message_id", flat=True))
    in_folder = [m for m in _mails(mail) if m["Message-ID"] in offer_ids]
    by_source = {"cleanup": events.exclude(source="host").count(),
                 "learner": events.filter(source="host").count()}
    report = {
        "freed": len(freed), "events": events.count(), "by_source": by_source,
        "offered": records.filter(outcome=FreedSeat.Outcome.OFFERED).count(),
        "offer_mails": len(in_folder),
        "sample": {key: in_folder[0][key] for key in ("To", "Subject", "Message-ID")}
        if in_folder else None,
    }
    once_each = (
        events.count() == len(freed)
        and not events.exclude(state=Event.State.DELIVERED).exists()
        and sorted(records.values_list("event_key", flat=True))
        == sorted(e.dedup_id for e in events)
        and report["offered"] == len(freed)
        and offered.count() == len(freed)
        and SeatHold.objects.filter(pk__in=offered.values("offer_hold_id")).count()
        == len(freed)
        and len(offer_ids) == len(freed) == len(in_folder)
        and by_source == {"cleanup": len(expiring), "learner": len(released)}
    )
    return report, once_each


def _due_active_reminders(run: Run) -> list[Reminder]:
    """Reminders eligible at the mark run's cutoff whose hold had not expired then: the
    ones to be sent (the run plans them as it goes, not all at dispatch)."""
    return list(Reminder.objects.filter(
        state=Reminder.State.PENDING, due_at__lte=run.cutoff,
        hold__status=SeatHold.Status.HELD, hold__expires_at__gt=run.cutoff,
    ).order_by("due_at"))


def _reminder_report(due: list[Reminder], moved: list[Reminder], mail: Path) -> dict:
    by_state = dict(Reminder.objects.values_list("state").annotate(n=Count("pk")).order_by())
    mails = _mails(mail)
    reminders = [m for m in mails if m["Message-ID"].startswith("<reminder-")]
    sample = reminders[0] if reminders else None
    return {
        "due_with_hold_active": len(due),
        "renewed_while_planned": [r.pk for r in moved],
        "by_state": by_state,
        # Every mail in the folder (the offers' too), and the reminders among them.
        "mails": len(mails),
        "reminder_mails": len(reminders),
        "folder": str(mail),
        "sample": {key: sample[key] for key in ("To", "Subject", "Message-ID")}
        if sample else None,
    }


def _reminder_checks(report: DemoReport, marks_run: Run, moved: list[Reminder]) -> dict:
    sent = Reminder.objects.filter(state=Reminder.State.SENT)
    ids = set(ReminderAttempt.objects.exclude(message_id="").values_list("message_id",
                                                                         flat=True))
    renewed_ok = all(
        (r := Reminder.objects.get(pk=m.pk)).state == Reminder.State.PENDING
        and r.due_at == reminder_due(SeatHold.objects.get(pk=r.hold_id).expires_at)
        for m in moved)
    return {
        "due reminders of active holds sent once, each with its own Message-ID":
            sent.count() == report.reminders["due_with_hold_active"] - len(moved)
            and ids == {message_id(r) for r in sent}
            and report.reminders["reminder_mails"] == sent.count(),
        "a reminder whose hold was renewed after the mark run's cutoff stayed pending, "
        "due again":
            renewed_ok,
        "no reminder left pending past its due time at the mark run's cutoff":
            not Reminder.objects.filter(state=Reminder.State.PENDING,
                                        due_at__lte=marks_run.cutoff)
            .exclude(pk__in=[m.pk for m in moved]).exists(),
    }


def _mails(folder: Path) -> list:
    """The mails in the folder, parsed: the file backend appends each to a file, then a
    line of dashes."""
    return [message_from_bytes(part) for path in sorted(folder.iterdir())
            if MAIL_FILE.fullmatch(path.name)
            for part in path.read_bytes().split(b"-" * 79 + b"\n") if part.strip()]


def _settled(runs: list[Run]) -> bool:
    return not Chunk.objects.filter(run__in=runs).exclude(
        state__in=(Chunk.State.ACKNOWLEDGED, Chunk.State.DEAD_LETTERED)).exists()


def _noops(run: Run) -> int:
    return sum(run.chunks.values_list("noop_deliveries", flat=True))


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.5)
