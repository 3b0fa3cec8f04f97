"""Send ready renewal reminders, each once: the scheduled sender.

Each reminder is one transaction: lock it (skipping any another sender holds), send
its mail, record the attempt and mark it sent, then commit. A crash after the mail
left and before the commit leaves the reminder ready, so it is sent again; the second
mail carries the same Message-ID, which lets a provider drop it.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime
from email.utils import parseaddr

import structlog
from django.conf import settings
from django.core.mail import EmailMessage, get_connection
from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from reservations.conf import conf
from reservations.models import Reminder, ReminderAttempt, SeatHold
from reservations.services import reminder_due, reminder_lead

log = structlog.get_logger("reservations.reminders")

SENT = "sent"
# Why a ready reminder was not sent (the counts send_ready_reminders returns).
HOLD_GONE = "hold_gone"
CONFIRMED = "confirmed"
EXPIRED = "expired"
RENEWED = "renewed"
# Reminders cancelled per statement when their holds moved on (expired, say).
CANCEL_BATCH = 10_000


def send_ready_reminders(*, batch: int | None = None) -> dict[str, int]:
    """Send up to ``batch`` ready reminders (RESERVATIONS_REMINDER_SEND_BATCH), oldest
    due first, for at most RESERVATIONS_REMINDER_SEND_SECONDS (well inside the task's
    timeout); return how many were sent and why the others were not.

    First, ready reminders whose hold is gone, confirmed or expired are cancelled in
    bulk (after an outage, reminders of holds that expired meanwhile are most of
    them), so the batch is spent on mails. A mail that cannot be sent stops the batch
    with its error, the reminder still ready for the next run.
    """
    outcomes = cancel_moot(timezone.now())
    # One connection to the mail server for the whole run, opened at the first mail.
    mail = get_connection()
    until = time.monotonic() + conf.REMINDER_SEND_SECONDS
    try:
        for _ in range(batch or conf.REMINDER_SEND_BATCH):
            if time.monotonic() > until:
                break
            with transaction.atomic():
                reminder = (Reminder.objects.select_for_update(skip_locked=True)
                            .filter(state=Reminder.State.READY).order_by("due_at", "pk")
                            .first())
                if reminder is None:
                    break
                outcome = _deliver(reminder, timezone.now(), mail)
            outcomes[outcome] += 1
    finally:
        mail.close()
    if outcomes:
        log.info("reminders sent", **outcomes)
    return dict(outcomes)


def cancel_moot(now: datetime) -> Counter:
    """Cancel the ready reminders that must not be sent, CANCEL_BATCH at a time; return
    how many, by reason.

    Each batch reads the ids, then updates them by id with the whole condition again
    (an UPDATE with the batch as an IN-subquery was planned as a nested loop over every
    ready reminder per row, when the statistics still said none was ready). So a
    reminder whose hold a renewal moved on meanwhile is left alone, and a renewal
    after the cancel brings it back (``renew_hold``).
    """
    holds = SeatHold.objects.filter(pk=OuterRef("hold_id"))
    reasons = {
        HOLD_GONE: ~Exists(holds),
        CONFIRMED: Exists(holds.exclude(status=SeatHold.Status.HELD)),
        EXPIRED: Exists(holds.filter(status=SeatHold.Status.HELD, expires_at__lte=now)),
    }
    ready = Reminder.objects.filter(state=Reminder.State.READY)
    cancelled: Counter = Counter()
    for reason, condition in reasons.items():
        while True:
            batch = list(ready.filter(condition).values_list("pk", flat=True)[:CANCEL_BATCH])
            if batch:
                # The reason again in the UPDATE's own WHERE: a hold renewed (and its
                # reminder marked again) since the ids were read is left alone.
                cancelled[reason] += ready.filter(condition, pk__in=batch).update(
                    state=Reminder.State.CANCELLED, updated_at=now)
            if len(batch) < CANCEL_BATCH:
                break
    return +cancelled


def message_id(reminder: Reminder) -> str:
    """The Message-ID of a reminder's mail: one per reminder and due time, whichever
    worker sends it, so a provider can drop a second send of the same mail."""
    domain = parseaddr(settings.DEFAULT_FROM_EMAIL)[1].rpartition("@")[2] or "localhost"
    due = reminder.due_at.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"<reminder-{reminder.pk}-{due}@{domain}>"


def _deliver(reminder: Reminder, now: datetime, mail) -> str:
    """Send one locked ready reminder, or set it aside; returns the outcome."""
    hold = SeatHold.objects.filter(pk=reminder.hold_id).values("status", "expires_at").first()
    # The reasons cancel_moot applies in bulk, for a hold that moved on since.
    if hold is None:
        moot = HOLD_GONE
    elif hold["status"] != SeatHold.Status.HELD:
        moot = CONFIRMED
    elif hold["expires_at"] <= now:
        moot = EXPIRED
    else:
        moot = None
    if moot is not None:
        _set(reminder, state=Reminder.State.CANCELLED, updated_at=now)
        return moot
    if hold["expires_at"] - reminder_lead() > now:
        # Renewed after it was marked: due again before the new expiry.
        _set(reminder, state=Reminder.State.PENDING, due_at=reminder_due(hold["expires_at"]),
             ready_at=None, updated_at=now)
        return RENEWED
    key = message_id(reminder)
    mail.open()  # once per run: it stays open for the next mails
    _mail(reminder, hold["expires_at"], key, mail).send()
    ReminderAttempt.objects.create(tenant_id=reminder.tenant_id, hold_id=reminder.hold_id,
                                   learner_ref=reminder.learner_ref, channel="email",
                                   sent_at=now, message_id=key)
    _set(reminder, state=Reminder.State.SENT, sent_at=now, updated_at=now)
    return SENT


def _mail(reminder: Reminder, expires_at: datetime, key: str, mail) -> EmailMessage:
    expiry = expires_at.astimezone(UTC).strftime("%H:%M UTC")
    return EmailMessage(
        subject=f"Your seat hold expires at {expiry}",
        body=(f"Your held seat expires at {expiry}. Renew the hold before then to keep "
              "the seat, or confirm it to make it yours."),
        to=[conf.LEARNER_EMAIL.format(learner_ref=reminder.learner_ref)],
        headers={"Message-ID": key},
        connection=mail,
    )


def _set(reminder: Reminder, **fields) -> None:
    Reminder.objects.filter(pk=reminder.pk).update(**fields)
