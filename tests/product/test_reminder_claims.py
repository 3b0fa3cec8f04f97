"""A renewal never waits on a send: the sender claims a reminder (state sending, a claim
time) in one short transaction, mails it holding no lock, and records the outcome in
another whose UPDATE matches only its own claim. A renewal or confirmation meanwhile
wins; a claim older than the lease (its sender died) is taken over by a later run under
the same Message-ID.

The tests marked django_db(transaction=True) run the sender on its own connection (a
thread), which must see the claim committed; the default per-test transaction would
hide it.
"""

from __future__ import annotations

import time
from datetime import timedelta
from smtplib import SMTPRecipientsRefused

import pytest
from django.core import mail
from django.core.mail.backends.locmem import EmailBackend as LocmemBackend
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from reservations.conf import conf
from reservations.models import Reminder, ReminderAttempt
from reservations.reminders import UNFINISHED, message_id, send_ready_reminders
from reservations.services import confirm_hold, renew_hold
from tests.engine.test_concurrency import Worker
from tests.factories import SectionFactory
from tests.product.test_reminder_failures import ScriptedSMTP
from tests.product.test_reminders import LOCMEM, due_hold, lead, made_ready, reminder_of, sent_ids

pytestmark = pytest.mark.django_db

PENDING, SENDING, SENT, CANCELLED, FAILED = (
    Reminder.State.PENDING, Reminder.State.SENDING, Reminder.State.SENT,
    Reminder.State.CANCELLED, Reminder.State.FAILED)


class WorkerKilled(BaseException):
    """The process dies (SIGKILL, the task timeout): nothing after it runs."""


class KilledAfterSendBackend(LocmemBackend):
    """Locmem, then the worker dies: the mail left, its outcome was never recorded."""

    def send_messages(self, messages):
        super().send_messages(messages)
        raise WorkerKilled


class TakenOverDuringSendBackend(LocmemBackend):
    """The first send outlives the lease: a later run takes the claim over and sends the
    mail, then the first send's server refuses it."""

    nested = False

    def send_messages(self, messages):
        if TakenOverDuringSendBackend.nested:
            return super().send_messages(messages)
        TakenOverDuringSendBackend.nested = True
        try:
            Reminder.objects.update(claimed_at=F("claimed_at") - past_the_lease())
            assert send_ready_reminders() == {"sent": 1}
        finally:
            TakenOverDuringSendBackend.nested = False
        raise SMTPRecipientsRefused({messages[0].to[0]: (550, b"5.1.1 no such user")})


class OutlastsItsLeaseBackend(LocmemBackend):
    """A send that outlasts its claim's lease: a later run takes the claim over and
    mails the reminder too, then this send goes through as well."""

    nested = False

    def send_messages(self, messages):
        if not OutlastsItsLeaseBackend.nested:
            OutlastsItsLeaseBackend.nested = True
            try:
                Reminder.objects.update(claimed_at=F("claimed_at") - past_the_lease())
                assert send_ready_reminders() == {"sent": 1}
            finally:
                OutlastsItsLeaseBackend.nested = False
        return super().send_messages(messages)


class TransactionSpyBackend(LocmemBackend):
    in_transaction: list[bool] = []

    def send_messages(self, messages):
        TransactionSpyBackend.in_transaction.append(connection.in_atomic_block)
        return super().send_messages(messages)


def past_the_lease() -> timedelta:
    return timedelta(seconds=conf.REMINDER_CLAIM_SECONDS + 1)


@pytest.mark.django_db(transaction=True)  # the sender on its own connection, see above
@pytest.mark.parametrize("learner_action, after", [(renew_hold, PENDING),
                                                   (confirm_hold, CANCELLED)],
                         ids=["renewal", "confirmation"])
def test_a_learner_acting_during_a_slow_send_does_not_wait_for_it_and_wins(
        settings, learner_action, after):
    # Every reply 0.3 s late (under EMAIL_TIMEOUT): the send takes about 2 s.
    settings.EMAIL_TIMEOUT = 3
    hold = due_hold(SectionFactory())
    reminder = made_ready(hold)
    with ScriptedSMTP(delay=0.3) as smtp:
        smtp.serve(settings)
        sender = Worker(send_ready_reminders)
        sender.start()
        assert smtp.connected.wait(10)  # the reminder is claimed, its send under way

        started = time.monotonic()
        acted = learner_action(hold.pk)
        waited = time.monotonic() - started
        assert sender.outcome() == {"sent": 1}

    send = smtp.delivered_at[0] - smtp.connected_at[0]
    assert waited < 0.25 * send, f"the {learner_action.__name__} took {waited:.2f} s " \
                                 f"of a {send:.2f} s send"
    moved = reminder_of(hold)
    assert (moved.state, moved.claimed_at) == (after, None)
    if after == PENDING:
        assert moved.due_at == acted.expires_at - lead()
    # The mail that left is on record, under the key of the due time it was sent for.
    assert [m["Message-ID"] for m in smtp.delivered] == [message_id(reminder)]
    assert list(ReminderAttempt.objects.values_list("message_id", flat=True)) == [
        message_id(reminder)]


@pytest.mark.django_db(transaction=True)  # autocommit as in a worker: no test transaction
def test_the_mail_is_sent_outside_any_transaction(settings):
    settings.EMAIL_BACKEND = f"{__name__}.TransactionSpyBackend"
    TransactionSpyBackend.in_transaction = []
    made_ready(due_hold(SectionFactory()))

    assert send_ready_reminders() == {"sent": 1}
    assert TransactionSpyBackend.in_transaction == [False]


def test_the_outcome_is_written_only_over_the_senders_own_claim(section, settings):
    settings.EMAIL_BACKEND = LOCMEM
    reminder = made_ready(due_hold(section))

    with CaptureQueriesContext(connection) as queries:
        assert send_ready_reminders() == {"sent": 1}

    table = Reminder._meta.db_table
    record = [q["sql"] for q in queries.captured_queries
              if q["sql"].startswith(f'UPDATE "{table}"') and "'sent'" in q["sql"]]
    (where,) = [sql.split(" WHERE ", 1)[1] for sql in record]
    assert f""""{table}"."state" = 'sending'""" in where
    assert f'"{table}"."claimed_at" = ' in where
    assert reminder_of(reminder.hold).state == SENT


def test_a_crash_between_send_and_record_is_taken_over_after_the_lease_under_the_same_id(
        section, settings):
    settings.EMAIL_BACKEND = f"{__name__}.KilledAfterSendBackend"
    reminder = made_ready(due_hold(section))
    with pytest.raises(WorkerKilled):
        send_ready_reminders()
    claimed = reminder_of(reminder.hold)
    assert (claimed.state, claimed.attempts, ReminderAttempt.objects.count()) == (SENDING, 1, 0)

    settings.EMAIL_BACKEND = LOCMEM
    assert send_ready_reminders() == {}  # inside the lease the claim may still be alive
    Reminder.objects.filter(pk=reminder.pk).update(claimed_at=F("claimed_at") - past_the_lease())
    assert send_ready_reminders() == {"sent": 1}

    assert sent_ids() == [message_id(reminder)] * 2
    after = reminder_of(reminder.hold)
    assert (after.state, after.attempts) == (SENT, 2)
    assert list(ReminderAttempt.objects.values_list("message_id", flat=True)) == [
        message_id(reminder)]


def test_a_claim_that_keeps_outliving_the_lease_gives_up_after_the_max_attempts(
        section, settings):
    settings.EMAIL_BACKEND = LOCMEM
    reminder = made_ready(due_hold(section))
    Reminder.objects.filter(pk=reminder.pk).update(
        state=SENDING, attempts=conf.REMINDER_MAX_ATTEMPTS,
        claimed_at=F("ready_at") - past_the_lease())

    assert send_ready_reminders() == {"failed": 1}

    given_up = reminder_of(reminder.hold)
    assert (given_up.state, given_up.failure) == (FAILED, Reminder.Failure.GAVE_UP)
    assert given_up.last_error == (
        f"gave up after {conf.REMINDER_MAX_ATTEMPTS} attempts; the last: a send started "
        "and never finished (its sender died or outlived the claim)")
    assert mail.outbox == []


def test_a_late_outcome_from_a_claim_taken_over_changes_nothing(section, settings):
    settings.EMAIL_BACKEND = f"{__name__}.TakenOverDuringSendBackend"
    reminder = made_ready(due_hold(section))

    # The first run's send is refused after the takeover sent the mail: its record
    # matches no row, so the reminder the later run sent stays sent.
    assert send_ready_reminders() == {"moved_on": 1}

    after = reminder_of(reminder.hold)
    # The last error is the takeover's, not the late refusal.
    assert (after.state, after.failure, after.last_error) == (SENT, "", UNFINISHED)
    assert sent_ids() == [message_id(reminder)]


def test_a_message_mailed_twice_after_its_lease_ran_out_is_recorded_once(section, settings):
    settings.EMAIL_BACKEND = f"{__name__}.OutlastsItsLeaseBackend"
    reminder = made_ready(due_hold(section))

    assert send_ready_reminders() == {"sent": 1}

    # Both sends carried the one Message-ID (a mail system keeps one of them); the
    # record holds one attempt for it.
    assert [m.extra_headers["Message-ID"] for m in mail.outbox] == [message_id(reminder)] * 2
    assert list(ReminderAttempt.objects.values_list("message_id", flat=True)) == [
        message_id(reminder)]
