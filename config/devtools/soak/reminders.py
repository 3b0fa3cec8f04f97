"""The soak's renewal reminders: reminders that fall due while it runs, the sender racing
the learners and the marking, and what the report finds about them afterwards."""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db.models import F, Q, Sum
from django.utils import timezone
from django_q.models import Task
from django_q.tasks import async_task

from cleanup.models import Chunk, Run
from config.devtools.soak.traffic import Renewal, TrafficLog
from reservations.models import Reminder, ReminderAttempt, SeatHold, Section
from reservations.policies import MARK_REMINDERS_READY
from reservations.reminders import RENEWED, SENT, send_ready_reminders
from reservations.services import reminder_due, reminder_lead

SENDER = "reservations.reminders.send_ready_reminders"
SENDER_GROUP = "soak-sender"
# Held seats seeded per second of soak whose reminders fall due while it runs.
DUE_PER_SECOND = 10


def remind(holds: Iterable[SeatHold]) -> int:
    """Give each hold its pending reminder, as hold_seat would have; return how many."""
    now = timezone.now()
    return len(Reminder.objects.bulk_create(
        Reminder.for_hold(hold, reminder_due(hold.expires_at), now) for hold in holds))


def seed_falling_due(duration: float, now: datetime) -> tuple[int, int]:
    """Held seats whose reminders fall due evenly over the soak (the holds outlast it);
    return how many holds and reminders were made."""
    sections = list(Section.objects.all())
    count = int(DUE_PER_SECOND * duration)
    holds = SeatHold.objects.bulk_create(
        SeatHold(tenant_id=section.tenant_id, section=section, learner_ref=f"reminded-{i}",
                 expires_at=now + reminder_lead() + timedelta(seconds=duration * i / count))
        for i, section in ((i, sections[i % len(sections)]) for i in range(1, count + 1))
    )
    return len(holds), remind(holds)


def send_in_clusters(rng: random.Random) -> int:
    """Have the clusters run the sender as its schedule would, sometimes twice at once;
    return how many runs."""
    runs = 2 if rng.random() < 0.4 else 1
    for _ in range(runs):
        # save: the clusters keep no task results, and the report reads these.
        async_task(SENDER, group=SENDER_GROUP, save=True)
    return runs


def send_the_rest() -> Counter:
    """The last run of the sender, in this process: until no reminder is ready."""
    outcomes: Counter = Counter()
    while sent := send_ready_reminders():
        outcomes.update(sent)
    return outcomes


def figures_and_checks(log: TrafficLog, seeded: int, since: datetime, final_mark: Run,
                       last_run: Counter, enqueued: int) -> tuple[dict, dict]:
    """What became of the reminders, and the checks on it."""
    final_mark.refresh_from_db()
    now = timezone.now()
    attempts = ReminderAttempt.objects.exclude(message_id="")  # the seeded ones have none
    sent = list(attempts.values_list("hold_id", "sent_at", "message_id"))
    reported = Task.objects.filter(group=SENDER_GROUP, started__gte=since, success=True)
    outcomes = Counter()
    for result in reported.values_list("result", flat=True):
        outcomes.update(result or {})
    in_clusters = Counter(outcomes)
    outcomes.update(last_run)
    ledger = Chunk.objects.filter(run__policy=MARK_REMINDERS_READY,
                                  run__created_at__gte=since).aggregate(
        marked=Sum("rows_updated", default=0), skipped=Sum("items_skipped", default=0))
    marked = ledger["marked"]
    early = Reminder.objects.filter(state__in=(Reminder.State.READY, Reminder.State.SENT)).filter(
        Q(ready_at__isnull=True) | Q(ready_at__lt=F("due_at"))).count()
    after_renewal = sent_after_a_renewal(sent, log.renewals)
    left_pending = Reminder.objects.filter(state=Reminder.State.PENDING,
                                           due_at__lte=final_mark.cutoff).count()
    ready_left = Reminder.objects.filter(state=Reminder.State.READY).count()
    sent_again = sent_more_than_once(sent, log.renewals)
    # A held seat's reminder is cancelled only by the sender, once the hold expired; a
    # renewal after that must have made it due again.
    cancelled_yet_held = Reminder.objects.filter(
        state=Reminder.State.CANCELLED, hold__status=SeatHold.Status.HELD,
        hold__expires_at__gt=now).count()
    unreminded = SeatHold.objects.filter(status=SeatHold.Status.HELD).exclude(
        pk__in=Reminder.objects.values("hold_id")).count()
    orphans = Reminder.objects.exclude(hold_id__in=SeatHold.objects.values("pk")).count()
    figures = {
        "created": seeded + len(log.created),
        "renewed": len(log.renewals),
        "renewed_while_falling_due": log.renewed_falling_due,
        "marked_ledger": marked,
        # Planned by a mark run, no longer eligible when its chunk's UPDATE ran (renewed,
        # confirmed, or deleted with its hold): the races the marking lost.
        "skipped_by_mark_chunks": ledger["skipped"],
        "sent": len(sent),
        "sent_while_soaking": in_clusters[SENT],
        "cancelled": Reminder.objects.filter(state=Reminder.State.CANCELLED).count(),
        "sender_runs": {"enqueued": enqueued, "reported": reported.count()},
        "sender_outcomes": dict(outcomes),
        "marked_before_due": early,
        "sent_after_a_renewal_moved_them": after_renewal,
        "pending_at_the_final_mark_cutoff": left_pending,
        "ready_after_the_last_sender_run": ready_left,
        "sent_more_than_once": sent_again,
        "cancelled_though_held_and_not_expired": cancelled_yet_held,
        "held_seats_without_a_reminder": unreminded,
        "reminders_outliving_their_hold": orphans,
    }
    checks = {
        "no reminder was marked before its due time (ready or sent: ready_at >= due_at)":
            early == 0,
        "no reminder was sent after a renewal had moved its due time past the send":
            after_renewal == 0,
        "no sender run found a marked reminder whose hold was renewed past the lead":
            outcomes[RENEWED] == 0,
        "no reminder left pending due at or before the final mark run's cutoff":
            final_mark.state == Run.State.COMPLETED and left_pending == 0,
        "no reminder left ready after the last sender run": ready_left == 0,
        "each reminder sent at most once (one attempt per Message-ID, and per hold "
        "between its renewals)":
            sent_again == 0,
        "no held seat that has not expired was left with its reminder cancelled":
            cancelled_yet_held == 0,
        "reminders follow their holds (every held seat has one, none outlived its hold)":
            unreminded == 0 and orphans == 0,
        "reminders fell due, were marked and sent while the soak ran, renewals racing":
            marked > 0 and in_clusters[SENT] > 0 and log.renewed_falling_due > 0,
    }
    return figures, checks


def sent_more_than_once(sent: list[tuple], renewals: list[Renewal]) -> int:
    """Attempts that repeat a Message-ID, or that mail a hold again with no renewal of
    it committed in between (a renewal racing a send wins, and reminds once more)."""
    repeated = len(sent) - len({key for _, _, key in sent})
    renewed: dict[int, list[datetime]] = defaultdict(list)
    for renewal in renewals:
        renewed[renewal.hold_id].append(renewal.committed_by)
    by_hold: dict[int, list[datetime]] = defaultdict(list)
    for hold_id, sent_at, _ in sent:
        by_hold[hold_id].append(sent_at)
    for hold_id, times in by_hold.items():
        times.sort()
        repeated += sum(
            not any(earlier <= moment <= later for moment in renewed[hold_id])
            for earlier, later in zip(times, times[1:], strict=False))
    return repeated


def sent_after_a_renewal(sent: list[tuple], renewals: list[Renewal]) -> int:
    """Attempts sent after a renewal of their hold had committed and before the due time
    that renewal gave: the sender must have seen the renewed hold and held back."""
    by_hold: dict[int, list[Renewal]] = defaultdict(list)
    for renewal in renewals:
        by_hold[renewal.hold_id].append(renewal)
    return sum(
        any(renewal.committed_by < sent_at < renewal.due_at for renewal in by_hold[hold_id])
        for hold_id, sent_at, _ in sent
    )
