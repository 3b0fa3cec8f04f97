"""Send ready renewal reminders, each once: the scheduled sender.

No row lock is held while a mail is sent, so a renewal never waits on the mail server.
Each reminder takes three steps: claim it (state ``sending``, a claim time, one more
attempt) in a short transaction, skipping any reminder another sender has locked; send
its mail outside any transaction; record the outcome in another short transaction whose
UPDATE matches only while the reminder is still ``sending`` under this claim. So a
renewal or a confirmation meanwhile wins, and so does a later run that took the claim
over.

A sender that dies between the send and the record leaves the reminder ``sending``; the
first run after the lease (RESERVATIONS_REMINDER_CLAIM_SECONDS) takes it over and sends
it again under the same Message-ID, which lets a provider drop the second copy.

A mail that cannot be sent never stops the run. A permanent refusal (SMTP 5xx) or an
address that cannot be one fails that reminder with its reason; a temporary failure
(4xx, a dropped connection, a time-out) leaves it ready for a later run, until it has
had RESERVATIONS_REMINDER_MAX_ATTEMPTS. Only a mail server that refuses the sender
itself (unreachable, or refusing its From) stops the run: every reminder would fail
alike, so none is charged.
"""

from __future__ import annotations

import time
from collections import Counter
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import parseaddr

import structlog
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.mail import EmailMessage, get_connection
from django.core.validators import validate_email
from django.db import transaction
from django.db.models import Exists, F, OuterRef, Q
from django.utils import timezone

from reservations.conf import conf
from reservations.exceptions import SendingStopped
from reservations.mail_failures import STOP, TEMPORARY, judge, line
from reservations.models import Reminder, ReminderAttempt, SeatHold
from reservations.services import reminder_due, reminder_lead

log = structlog.get_logger("reservations.reminders")

SENT = "sent"
# Why a ready reminder was not sent (the counts send_ready_reminders returns).
HOLD_GONE = "hold_gone"
CONFIRMED = "confirmed"
EXPIRED = "expired"
RENEWED = "renewed"
FAILED = "failed"  # refused for good, not a mail address, or out of attempts
DEFERRED = "deferred"  # a temporary failure: ready again for a later run
MOVED_ON = "moved_on"  # renewed, confirmed or taken over while its mail failed
# Reminders cancelled per statement when their holds moved on (expired, say).
CANCEL_BATCH = 10_000
UNFINISHED = "a send started and never finished (its sender died or outlived the claim)"


@dataclass(frozen=True)
class Claim:
    """A reminder as its sender claimed it: what the mail and the record need."""

    pk: int
    tenant_id: int
    hold_id: int
    learner_ref: str
    address: str
    due_at: datetime
    expires_at: datetime
    claimed_at: datetime
    attempts: int


@dataclass
class SendReport:
    """What one run of the sender did."""

    outcomes: Counter = field(default_factory=Counter)
    # (reminder id, hold id, reason) of each reminder the run marked failed.
    failures: list[tuple[int, int, str]] = field(default_factory=list)

    def failed(self, pk: int, hold_id: int, reason: str) -> None:
        self.outcomes[FAILED] += 1
        self.failures.append((pk, hold_id, reason))


def send_ready_reminders(*, batch: int | None = None) -> dict[str, int]:
    """The scheduled task: send_reminders, returning its counts by outcome."""
    return dict(send_reminders(batch=batch).outcomes)


def send_reminders(*, batch: int | None = None) -> SendReport:
    """Send up to ``batch`` ready reminders (RESERVATIONS_REMINDER_SEND_BATCH), oldest
    due first, each at most once per run, for at most RESERVATIONS_REMINDER_SEND_SECONDS
    (well inside the task's timeout); report how many were sent and why the others were
    not.

    First, claims that outlived the lease are taken back, and ready reminders whose hold
    is gone, confirmed or expired are cancelled in bulk (after an outage, reminders of
    holds that expired meanwhile are most of them), so the batch is spent on mails.
    Raises SendingStopped, the reminder it held ready again, when the mail server
    refuses the sender itself.
    """
    started = timezone.now()
    report = SendReport()
    for pk, hold_id, reason in take_over_stale_claims(started):
        report.failed(pk, hold_id, reason)
    report.outcomes.update(cancel_moot(started))
    # One connection to the mail server for the run, opened at its first mail (and
    # again after a failure that may have broken the conversation).
    mail = get_connection()
    until = time.monotonic() + conf.REMINDER_SEND_SECONDS
    try:
        for _ in range(batch or conf.REMINDER_SEND_BATCH):
            if time.monotonic() > until:
                break
            with transaction.atomic():
                reminder = _next_ready(started)
                if reminder is None:
                    break
                claim = _claim(reminder, timezone.now(), report)
            if claim is not None:
                _send(claim, mail, report)
    except SendingStopped as stopped:
        log.error("reminder sending stopped", cause=stopped.cause, **report.outcomes)
        raise
    finally:
        _hang_up(mail)
    if report.outcomes:
        log.info("reminders sent", **report.outcomes)
    return report


def take_over_stale_claims(now: datetime) -> list[tuple[int, int, str]]:
    """Put the reminders claimed longer than the lease ago back to ready: their sender
    died, or outlived the claim, before it recorded what became of the mail. One that
    has had all its attempts fails instead; return those, as (id, hold id, reason)."""
    stale = Reminder.objects.filter(
        state=Reminder.State.SENDING,
        claimed_at__lte=now - timedelta(seconds=conf.REMINDER_CLAIM_SECONDS))
    if not stale.exists():
        return []
    limit = conf.REMINDER_MAX_ATTEMPTS
    reason = f"gave up after {limit} attempts; the last: {UNFINISHED}"
    with transaction.atomic():
        spent = list(stale.filter(attempts__gte=limit).select_for_update(skip_locked=True)
                     .values_list("pk", "hold_id"))
        if spent:
            stale.filter(pk__in=[pk for pk, _ in spent]).update(
                state=Reminder.State.FAILED, failure=Reminder.Failure.GAVE_UP,
                last_error=reason, updated_at=now)
    # The condition again in the UPDATE's own WHERE: a claim recorded or renewed since
    # is left alone.
    taken = stale.update(state=Reminder.State.READY, last_error=UNFINISHED, updated_at=now)
    if taken or spent:
        log.warning("reminder claims taken over", ready_again=taken, failed=len(spent))
    return [(pk, hold_id, reason) for pk, hold_id in spent]


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


def message_id(reminder: Reminder | Claim) -> str:
    """The Message-ID of a reminder's mail: one per reminder and due time, whichever
    worker sends it, so a provider can drop a second send of the same mail."""
    domain = parseaddr(settings.DEFAULT_FROM_EMAIL)[1].rpartition("@")[2] or "localhost"
    due = reminder.due_at.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"<reminder-{reminder.pk}-{due}@{domain}>"


def _next_ready(started: datetime) -> Reminder | None:
    """The oldest ready reminder this run has not tried yet, row-locked."""
    return (Reminder.objects.select_for_update(skip_locked=True)
            .filter(Q(claimed_at__isnull=True) | Q(claimed_at__lt=started),
                    state=Reminder.State.READY)
            .order_by("due_at", "pk").first())


def _claim(reminder: Reminder, now: datetime, report: SendReport) -> Claim | None:
    """Claim one locked ready reminder for sending, or set it aside (counted)."""
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
        report.outcomes[moot] += 1
        return None
    if hold["expires_at"] - reminder_lead() > now:
        # Renewed after it was marked: due again before the new expiry.
        _set(reminder, state=Reminder.State.PENDING, due_at=reminder_due(hold["expires_at"]),
             ready_at=None, attempts=0, last_error="", updated_at=now)
        report.outcomes[RENEWED] += 1
        return None
    address = conf.LEARNER_EMAIL.format(learner_ref=reminder.learner_ref)
    try:
        validate_email(address)
    except ValidationError:
        # Never handed to a backend: a newline or a bracket in it would end the send
        # with a ValueError, or worse, reach another header.
        reason = f"not a mail address: {address!r}"
        _set(reminder, state=Reminder.State.FAILED, failure=Reminder.Failure.BAD_ADDRESS,
             last_error=reason, updated_at=now)
        report.failed(reminder.pk, reminder.hold_id, reason)
        return None
    _set(reminder, state=Reminder.State.SENDING, claimed_at=now,
         attempts=F("attempts") + 1, updated_at=now)
    return Claim(pk=reminder.pk, tenant_id=reminder.tenant_id, hold_id=reminder.hold_id,
                 learner_ref=reminder.learner_ref, address=address, due_at=reminder.due_at,
                 expires_at=hold["expires_at"], claimed_at=now,
                 attempts=reminder.attempts + 1)


def _send(claim: Claim, mail, report: SendReport) -> None:
    """Mail one claimed reminder, holding no lock, then record what became of it."""
    key = message_id(claim)
    message = _mail(claim, key, mail)
    try:
        mail.open()  # once per run: it stays open for the next mails
    except Exception as exc:
        # The server cannot be reached (or refuses the login): not this reminder's
        # fault, so it is ready again and the attempt not counted.
        _settle(claim, state=Reminder.State.READY, attempts=F("attempts") - 1,
                last_error=line(exc))
        raise SendingStopped(line(exc), dict(report.outcomes)) from exc
    try:
        message.send()
    except Exception as exc:
        # A failure may leave the conversation broken: the next mail opens a new one.
        _hang_up(mail)
        _failed_send(claim, exc, report)
        return
    # Sent as of its claim, when the sender last saw the hold: a renewal committed after
    # that could not have held the mail back.
    sent_at = claim.claimed_at
    with transaction.atomic():
        ReminderAttempt.objects.get_or_create(
            message_id=key, defaults={"tenant_id": claim.tenant_id, "hold_id": claim.hold_id,
                                      "learner_ref": claim.learner_ref, "channel": "email",
                                      "sent_at": sent_at})
        recorded = _settle(claim, state=Reminder.State.SENT, sent_at=sent_at)
    if not recorded:
        log.info("reminder moved on while its mail was sent", reminder=claim.pk)
    report.outcomes[SENT] += 1


def _failed_send(claim: Claim, exc: Exception, report: SendReport) -> None:
    verdict, reason = judge(exc)
    if verdict == STOP:
        _settle(claim, state=Reminder.State.READY, attempts=F("attempts") - 1,
                last_error=reason)
        raise SendingStopped(reason, dict(report.outcomes)) from exc
    if verdict == TEMPORARY and claim.attempts < conf.REMINDER_MAX_ATTEMPTS:
        outcome, fields = DEFERRED, {"state": Reminder.State.READY, "last_error": reason}
    else:
        if verdict == TEMPORARY:
            verdict = Reminder.Failure.GAVE_UP
            reason = f"gave up after {claim.attempts} attempts; the last: {reason}"
        outcome, fields = FAILED, {"state": Reminder.State.FAILED, "failure": verdict,
                                   "last_error": reason}
    log.warning("reminder not sent", reminder=claim.pk, outcome=outcome, reason=reason)
    if not _settle(claim, **fields):
        report.outcomes[MOVED_ON] += 1
    elif outcome == FAILED:
        report.failed(claim.pk, claim.hold_id, reason)
    else:
        report.outcomes[DEFERRED] += 1


def _mail(claim: Claim, key: str, mail) -> EmailMessage:
    expiry = claim.expires_at.astimezone(UTC).strftime("%H:%M UTC")
    return EmailMessage(
        subject=f"Your seat hold expires at {expiry}",
        body=(f"Your held seat expires at {expiry}. Renew the hold before then to keep "
              "the seat, or confirm it to make it yours."),
        to=[claim.address],
        headers={"Message-ID": key},
        connection=mail,
    )


def _settle(claim: Claim, **fields) -> bool:
    """Record an outcome over this sender's own claim; False when the reminder moved on
    meanwhile (renewed, confirmed, or taken over by a later run), which then wins."""
    return bool(Reminder.objects.filter(
        pk=claim.pk, state=Reminder.State.SENDING, claimed_at=claim.claimed_at,
    ).update(updated_at=timezone.now(), **fields))


def _hang_up(mail) -> None:
    # A server that already hung up (or timed out) makes the QUIT fail; the connection
    # is gone either way.
    with suppress(OSError):
        mail.close()


def _set(reminder: Reminder, **fields) -> None:
    """Move a reminder this run holds locked on, from the state it was read in."""
    Reminder.objects.filter(pk=reminder.pk, state=reminder.state).update(**fields)
