"""Renewal reminders: the services keep a hold's reminder in step, the database deletes it
with its hold (so the hold table keeps its single-statement DELETE), the
mark-reminders-ready policy marks each due one once, and the sender mails each ready one
once, with a Message-ID that stays the same when a crash makes it send again.

The tests marked django_db(transaction=True) run threads on their own connections, which
must see one another's commits; the default per-test transaction would hide them.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import datetime, timedelta
from smtplib import SMTPServerDisconnected

import pytest
from django.core import mail
from django.core.mail.backends.base import BaseEmailBackend
from django.core.mail.backends.locmem import EmailBackend as LocmemBackend
from django.db import OperationalError, connection, transaction
from django.db.models.deletion import Collector
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from cleanup import faults
from cleanup.checks import check_policies
from cleanup.engine.dispatch import dispatch
from cleanup.engine.worker import Outcome, apply_chunk
from cleanup.models import Chunk
from cleanup.policies import get_policy, registered
from reservations.conf import conf
from reservations.models import Reminder, ReminderAttempt, SeatHold
from reservations.policies import EXPIRE_HOLDS, MARK_REMINDERS_READY, expired_holds
from reservations.reminders import message_id, send_ready_reminders
from reservations.services import confirm_hold, hold_seat, release_hold, renew_hold
from tests.conftest import wait_for
from tests.engine.test_concurrency import Worker, hold_lock_while, waiting_statements
from tests.engine.test_migrations import latest, migrate
from tests.factories import SectionFactory

pytestmark = pytest.mark.django_db

LOCMEM = "django.core.mail.backends.locmem.EmailBackend"
PENDING, READY, SENT, CANCELLED = (Reminder.State.PENDING, Reminder.State.READY,
                                   Reminder.State.SENT, Reminder.State.CANCELLED)


def lead() -> timedelta:
    return timedelta(minutes=conf.REMINDER_LEAD_MINUTES)


def due_hold(section, learner_ref: str = "ada") -> SeatHold:
    """A held seat inside its reminder's lead: it expires in three minutes."""
    held_at = timezone.now() - timedelta(minutes=conf.HOLD_MINUTES) + timedelta(minutes=3)
    return hold_seat(section.pk, learner_ref, now=held_at)


def reminder_of(hold: SeatHold) -> Reminder:
    return Reminder.objects.get(hold_id=hold.pk)


def made_ready(hold: SeatHold) -> Reminder:
    """The hold's reminder as mark-reminders-ready leaves it."""
    Reminder.objects.filter(hold_id=hold.pk).update(state=READY, ready_at=timezone.now())
    return reminder_of(hold)


def statements_on(table: str, queries) -> list[tuple[int, str]]:
    """The captured INSERT/UPDATE/DELETE statements on ``table``, with their positions."""
    heads = (f'UPDATE "{table}"', f'DELETE FROM "{table}"', f'INSERT INTO "{table}"')
    return [(n, q["sql"]) for n, q in enumerate(queries.captured_queries)
            if q["sql"].startswith(heads)]


def selects_of(table: str, queries, before: int) -> list[str]:
    return [q["sql"] for q in queries.captured_queries[:before]
            if q["sql"].startswith("SELECT") and f'FROM "{table}"' in q["sql"]]


# Services


def test_hold_seat_makes_one_pending_reminder_due_the_lead_before_expiry(settings, section):
    settings.RESERVATIONS_REMINDER_LEAD_MINUTES = 7

    hold = hold_seat(section.pk, "ada")

    (reminder,) = Reminder.objects.filter(hold_id=hold.pk)
    assert reminder.state == PENDING
    assert reminder.due_at == hold.expires_at - timedelta(minutes=7)
    assert (reminder.tenant_id, reminder.learner_ref) == (hold.tenant_id, "ada")


@pytest.mark.parametrize("state", [PENDING, READY])
def test_renewal_moves_an_unsent_reminder_and_puts_it_back_to_pending(section, state):
    hold = due_hold(section)
    Reminder.objects.filter(hold_id=hold.pk).update(state=state, ready_at=timezone.now())

    renewed = renew_hold(hold.pk)

    reminder = reminder_of(hold)
    assert reminder.due_at == renewed.expires_at - lead() > hold.expires_at - lead()
    assert (reminder.state, reminder.ready_at) == (PENDING, None)


def test_renewal_leaves_a_sent_reminder_sent(section):
    hold = due_hold(section)
    Reminder.objects.filter(hold_id=hold.pk).update(state=SENT, sent_at=timezone.now())
    sent = reminder_of(hold)

    renew_hold(hold.pk)

    reminder = reminder_of(hold)
    assert (reminder.state, reminder.due_at) == (SENT, sent.due_at)


def test_renewing_an_expired_hold_brings_back_the_reminder_the_sender_cancelled(section):
    expired = hold_seat(section.pk, "ada", now=timezone.now() - timedelta(minutes=20))
    made_ready(expired)
    assert send_ready_reminders() == {"expired": 1}
    assert reminder_of(expired).state == CANCELLED

    renewed = renew_hold(expired.pk)

    reminder = reminder_of(renewed)
    assert (reminder.state, reminder.due_at) == (PENDING, renewed.expires_at - lead())


def test_renewing_a_hold_that_has_no_reminder_gives_it_one(section):
    # Expired before reminders existed: the migration made reminders for live holds only.
    hold = hold_seat(section.pk, "ada", now=timezone.now() - timedelta(minutes=20))
    Reminder.objects.filter(hold_id=hold.pk).delete()

    renewed = renew_hold(hold.pk)

    (reminder,) = Reminder.objects.filter(hold_id=hold.pk)
    assert (reminder.state, reminder.due_at) == (PENDING, renewed.expires_at - lead())


@pytest.mark.parametrize("state", [PENDING, READY])
def test_confirmation_cancels_the_unsent_reminder(section, state):
    hold = due_hold(section)
    Reminder.objects.filter(hold_id=hold.pk).update(state=state)

    confirm_hold(hold.pk)

    assert reminder_of(hold).state == CANCELLED


def test_release_deletes_the_reminder_with_the_hold_in_the_database(section):
    released, kept = due_hold(section, "ada"), due_hold(section, "bob")

    with CaptureQueriesContext(connection) as queries:
        assert release_hold(released.pk) is True

    # Django issued no statement on reminders: the hold table's statement-level trigger
    # deleted it.
    assert statements_on(Reminder._meta.db_table, queries) == []
    assert list(Reminder.objects.values_list("hold_id", flat=True)) == [kept.pk]


# The hold table's fast delete path


def test_expire_chunk_is_one_delete_on_holds_and_the_database_drops_their_reminders(section):
    hour_ago = timezone.now() - timedelta(hours=1)
    expired = [hold_seat(section.pk, f"gone-{n}", now=hour_ago) for n in range(3)]
    active = due_hold(section)
    chunk = dispatch(EXPIRE_HOLDS).run.chunks.get()
    assert Reminder.objects.filter(hold_id__in=[h.pk for h in expired]).count() == 3

    with CaptureQueriesContext(connection) as queries:
        assert apply_chunk(chunk.message) == Outcome.DELETED

    ((position, delete),) = statements_on(SeatHold._meta.db_table, queries)
    assert delete.startswith('DELETE FROM "reservations_seathold" WHERE ')
    where = delete.split(" WHERE ", 1)[1]
    assert '"reservations_seathold"."status" = ' in where
    assert '"reservations_seathold"."expires_at" <= ' in where
    assert '"reservations_seathold"."expires_at") IN ' in where  # the observed expiry
    assert 'FROM "reservations_seathold"' not in where  # no subquery over the table
    assert selects_of(SeatHold._meta.db_table, queries, before=position) == []
    assert statements_on(Reminder._meta.db_table, queries) == []
    assert list(Reminder.objects.values_list("hold_id", flat=True)) == [active.pk]


def test_holds_can_still_be_fast_deleted_with_reminders_pointing_at_them():
    assert [e for e in check_policies() if e.id == "cleanup.E004"] == []
    doomed = SeatHold.objects.filter(expired_holds(timezone.now()))
    assert Collector(using="default", origin=doomed).can_fast_delete(doomed)


# The trigger behind it (migrations 0004 and 0007)

BY_ID = "DELETE FROM reservations_reminder WHERE hold_id = ANY (ARRAY(SELECT id FROM gone));"
BY_JOIN = ("DELETE FROM reservations_reminder AS reminder USING gone"
           " WHERE reminder.hold_id = gone.id;")
BEFORE_CHEAPER = [("reservations", "0006_one_attempt_per_message")]


def trigger_body() -> str:
    """The installed trigger function's body, its whitespace folded to single spaces."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT prosrc FROM pg_proc"
                       " WHERE proname = 'reservations_delete_reminders_of_gone_holds'")
        (body,) = cursor.fetchone()
    return " ".join(body.split())


def test_the_trigger_finds_the_gone_holds_reminders_by_hold_id_in_an_array():
    assert BY_ID in trigger_body()
    assert "USING gone" not in trigger_body()


@pytest.mark.django_db(transaction=True)  # the executor commits each step, as migrate does
def test_migration_0007_reverses_to_the_join_and_back():
    try:
        migrate(BEFORE_CHEAPER)
        assert BY_JOIN in trigger_body()
    finally:
        migrate(latest())  # the tests after this one expect the newest schema
    assert BY_ID in trigger_body()


# The update path: mark-reminders-ready


@pytest.mark.parametrize("ledger_reopened", [False, True], ids=["redelivered", "reopened"])
def test_a_mark_ready_chunk_delivered_twice_marks_each_reminder_once(section, ledger_reopened):
    # ready_at is the UPDATE's statement time: a second marking would move it.
    holds = [due_hold(section, f"learner-{n}") for n in range(3)]
    chunk = dispatch(MARK_REMINDERS_READY).run.chunks.get()
    assert apply_chunk(chunk.message) == Outcome.UPDATED
    first = dict(Reminder.objects.values_list("pk", "ready_at"))
    if ledger_reopened:
        # Even were the ledger to let the delivery through again, the UPDATE's own WHERE
        # (state = 'pending') no longer matches the reminders it marked.
        Chunk.objects.filter(pk=chunk.pk).update(state=Chunk.State.ENQUEUED)

    assert apply_chunk(chunk.message) == Outcome.NOOP

    assert set(Reminder.objects.values_list("state", flat=True)) == {READY}
    assert dict(Reminder.objects.values_list("pk", "ready_at")) == first
    chunk.refresh_from_db()
    assert (chunk.rows_updated, chunk.noop_deliveries) == (len(holds), 1)


def test_a_renewal_between_planning_and_the_update_keeps_the_reminder_pending(section):
    renewed, marked = due_hold(section, "ada"), due_hold(section, "bob")
    chunk = dispatch(MARK_REMINDERS_READY).run.chunks.get()
    observed = {pk: datetime.fromisoformat(due) for pk, due in chunk.message["items"]}
    assert observed[reminder_of(renewed).pk] == reminder_of(renewed).due_at
    # Renewed as of a minute after it was held: still due before the cutoff, so only the
    # observed due_at the message carries tells the UPDATE to spare it.
    renew_hold(renewed.pk, now=renewed.created_at + timedelta(minutes=1))
    moved = reminder_of(renewed)
    assert observed[moved.pk] < moved.due_at <= chunk.run.cutoff

    assert apply_chunk(chunk.message) == Outcome.UPDATED

    assert (reminder_of(renewed).state, reminder_of(renewed).due_at) == (PENDING, moved.due_at)
    assert reminder_of(marked).state == READY
    chunk.refresh_from_db()
    assert (chunk.rows_updated, chunk.items_skipped) == (1, 1)


@pytest.mark.usefixtures("row_locks_waited")
@pytest.mark.django_db(transaction=True)  # the renewal and the chunk on their own connections
@pytest.mark.parametrize("renewed_at", [
    lambda hold: timezone.now(),
    # A minute after it was held: due again before the cutoff, but not when observed.
    lambda hold: hold.created_at + timedelta(minutes=1),
], ids=["due-after-the-cutoff", "due-before-the-cutoff"])
def test_a_renewal_holding_the_reminder_lock_survives_a_waiting_mark_ready_update(renewed_at):
    """PostgreSQL re-checks the UPDATE's own WHERE, observed due_at included, against the
    reminder the renewal changed while the UPDATE waited for its lock."""
    hold = due_hold(SectionFactory())
    chunk = dispatch(MARK_REMINDERS_READY).run.chunks.get()
    locked, release = threading.Event(), threading.Event()
    renewer = Worker(hold_lock_while, hold.pk, locked, release,
                     lambda pk: renew_hold(pk, now=renewed_at(hold)))
    renewer.start()
    assert locked.wait(10)

    marker = Worker(apply_chunk, chunk.message)
    marker.start()
    wait_for(lambda: waiting_statements('UPDATE "reservations_reminder"') == 1, timeout=10,
             what="the chunk's UPDATE to wait on the reminder's row lock")
    release.set()

    assert renewer.outcome() is None
    assert marker.outcome() == Outcome.NOOP
    reminder = reminder_of(hold)
    expected_due = SeatHold.objects.get(pk=hold.pk).expires_at - lead()
    assert (reminder.state, reminder.due_at) == (PENDING, expected_due)
    chunk.refresh_from_db()
    assert (chunk.state, chunk.rows_updated, chunk.items_skipped) == ("committed", 0, 1)


def test_a_failure_before_commit_marks_nothing_and_the_next_delivery_does(section, settings):
    settings.CLEANUP_TRANSIENT_RETRIES = 0  # hand the failure straight back to the broker
    holds = [due_hold(section, f"learner-{n}") for n in range(3)]
    chunk = dispatch(MARK_REMINDERS_READY).run.chunks.get()
    seen = []

    def lost_before_commit():
        # The UPDATE and the ledger write ran in this transaction, not yet committed.
        seen.append(Reminder.objects.filter(state=READY).count())
        if len(seen) == 1:
            raise OperationalError("injected: connection lost before commit")

    with faults.injected(faults.BEFORE_COMMIT, lost_before_commit):
        with pytest.raises(OperationalError):
            apply_chunk(chunk.message)
        assert set(Reminder.objects.values_list("state", "ready_at")) == {(PENDING, None)}
        chunk.refresh_from_db()
        assert (chunk.state, chunk.rows_updated) == (Chunk.State.RETRYING, 0)

        assert apply_chunk(chunk.message) == Outcome.UPDATED  # the broker's redelivery

    assert seen == [3, 3]
    assert set(Reminder.objects.values_list("state", flat=True)) == {READY}
    chunk.refresh_from_db()
    assert (chunk.state, chunk.rows_updated) == (Chunk.State.COMMITTED, len(holds))


def test_a_mark_ready_chunk_is_one_update_carrying_the_whole_predicate(section):
    for n in range(3):
        due_hold(section, f"learner-{n}")
    chunk = dispatch(MARK_REMINDERS_READY).run.chunks.get()

    with CaptureQueriesContext(connection) as queries:
        assert apply_chunk(chunk.message) == Outcome.UPDATED

    table = Reminder._meta.db_table
    ((position, update),) = statements_on(table, queries)
    assert update.startswith(f'UPDATE "{table}" SET ')
    where = update.split(" WHERE ", 1)[1]
    assert f""""{table}"."state" = 'pending'""" in where
    assert f'"{table}"."due_at" <= ' in where
    assert f'("{table}"."id", "{table}"."due_at") IN ' in where  # each row's observed due_at
    assert f'FROM "{table}"' not in where  # no subquery over the table
    assert selects_of(table, queries, before=position) == []


# The sender


class RendezvousBackend(LocmemBackend):
    """Locmem, except that each thread's first mail waits for the other thread's first
    mail: both senders then hold a reminder's row lock at once."""

    barrier: threading.Barrier
    senders = threading.local()

    def send_messages(self, messages):
        if not getattr(self.senders, "met", False):
            self.senders.met = True
            self.barrier.wait()
        return super().send_messages(messages)


class FailingBackend(BaseEmailBackend):
    """A mail server that is gone; like Django's SMTP backend, it honours fail_silently."""

    def send_messages(self, messages):
        if self.fail_silently:
            return 0
        raise SMTPServerDisconnected("injected: the mail server went away")


class WorkerCrashed(Exception):
    pass


def sent_ids() -> list[str]:
    return [m.message()["Message-ID"] for m in mail.outbox]


def test_the_sender_mails_each_ready_reminder_once_with_its_message_id(section, settings):
    settings.EMAIL_BACKEND = LOCMEM
    reminders = [made_ready(due_hold(section, f"learner-{n}")) for n in range(2)]
    pending = reminder_of(due_hold(section, "not-yet"))

    assert send_ready_reminders() == {"sent": 2}
    assert send_ready_reminders() == {}

    assert sorted(sent_ids()) == sorted(message_id(r) for r in reminders)
    assert sorted(m.to[0] for m in mail.outbox) == [
        "learner-0@learners.example.edu", "learner-1@learners.example.edu"]
    attempts = ReminderAttempt.objects.order_by("hold_id")
    assert [(a.hold_id, a.message_id) for a in attempts] == [
        (r.hold_id, message_id(r)) for r in reminders]
    assert set(Reminder.objects.filter(pk__in=[r.pk for r in reminders])
               .values_list("state", flat=True)) == {SENT}
    assert reminder_of(pending.hold).state == PENDING


def test_a_resend_after_a_crash_before_commit_carries_the_same_message_id(section, settings):
    settings.EMAIL_BACKEND = LOCMEM
    reminder = made_ready(due_hold(section))

    with pytest.raises(WorkerCrashed), transaction.atomic():
        send_ready_reminders()
        raise WorkerCrashed  # the mail left; the worker dies before the commit

    # The attempt was written in the transaction that rolled back, with the sent mark.
    assert (reminder_of(reminder.hold).state, ReminderAttempt.objects.count()) == (READY, 0)
    assert send_ready_reminders() == {"sent": 1}
    assert sent_ids() == [message_id(reminder)] * 2
    assert list(ReminderAttempt.objects.values_list("message_id", flat=True)) == [
        message_id(reminder)]


@pytest.mark.django_db(transaction=True)  # the two senders on their own connections
def test_duplicate_sender_deliveries_send_each_reminder_once_in_total(settings):
    settings.EMAIL_BACKEND = f"{__name__}.RendezvousBackend"
    # Without skip_locked, the second sender would wait on the first one's locked
    # reminder while the first waits for it at the barrier, and the barrier would break.
    RendezvousBackend.barrier = threading.Barrier(2, timeout=5)
    section = SectionFactory()
    reminders = [made_ready(due_hold(section, f"learner-{n}")) for n in range(6)]

    senders = [Worker(send_ready_reminders) for _ in range(2)]
    for sender in senders:
        sender.start()
    results = [sender.outcome() for sender in senders]

    assert all(result["sent"] >= 1 for result in results)
    assert sum(result["sent"] for result in results) == len(reminders)
    assert sorted(sent_ids()) == sorted(message_id(r) for r in reminders)
    assert sorted(ReminderAttempt.objects.values_list("message_id", flat=True)) == sorted(
        message_id(r) for r in reminders)
    assert set(Reminder.objects.values_list("state", flat=True)) == {SENT}


@pytest.mark.parametrize("race, outcome, state", [
    (lambda now: {"status": SeatHold.Status.CONFIRMED}, "confirmed", CANCELLED),
    (lambda now: {"expires_at": now - timedelta(minutes=1)}, "expired", CANCELLED),
    (lambda now: {"expires_at": now + timedelta(minutes=30)}, "renewed", PENDING),
], ids=["hold-confirmed", "hold-expired", "hold-renewed-past-the-lead"])
def test_the_sender_skips_a_reminder_whose_hold_moved_on(section, settings, race, outcome,
                                                         state):
    settings.EMAIL_BACKEND = LOCMEM
    hold = due_hold(section)
    reminder = made_ready(hold)
    # Written directly, not through the services, as a change racing the marking would.
    SeatHold.objects.filter(pk=hold.pk).update(**race(timezone.now()))

    assert send_ready_reminders() == {outcome: 1}

    assert (mail.outbox, ReminderAttempt.objects.count()) == ([], 0)
    after = reminder_of(hold)
    assert after.state == state
    if state == PENDING:
        assert after.due_at == SeatHold.objects.get(pk=hold.pk).expires_at - lead()
        assert after.ready_at is None
    else:
        assert after.due_at == reminder.due_at


def test_a_mail_that_cannot_be_sent_leaves_the_reminder_ready_and_the_run_goes_on(
        section, settings):
    # Once the run stopped at the first such mail; now each is deferred to a later run
    # (tests/product/test_reminder_failures.py has the real SMTP server's refusals).
    settings.EMAIL_BACKEND = f"{__name__}.FailingBackend"
    holds = [due_hold(section, f"learner-{n}") for n in range(2)]
    for hold in holds:
        made_ready(hold)

    assert send_ready_reminders() == {"deferred": 2}

    assert [(reminder_of(hold).state, reminder_of(hold).attempts) for hold in holds] == [
        (READY, 1), (READY, 1)]
    assert {reminder_of(hold).last_error for hold in holds} == {
        "SMTPServerDisconnected: injected: the mail server went away"}
    assert ReminderAttempt.objects.count() == 0


# The system check


@pytest.mark.parametrize("update, refused", [
    (None, False),  # as shipped
    ({"ready_at": Now(), "updated_at": Now()}, True),  # the reminder would stay pending
], ids=["shipped", "leaves-it-pending"])
def test_e012_accepts_the_shipped_mark_ready_update(update, refused):
    shipped = get_policy(MARK_REMINDERS_READY)
    assert shipped.mutation == "update"
    with registered(shipped if update is None else replace(shipped, update=update)):
        errors = [e for e in check_policies() if e.id == "cleanup.E012"]
    assert [MARK_REMINDERS_READY in e.msg for e in errors] == ([True] if refused else [])


@pytest.mark.parametrize("template", ["{name}@example.edu", "everyone@example.edu",
                                      "{learner_ref}", "{learner_ref@x"])
def test_a_reminder_address_format_that_cannot_give_addresses_is_refused(settings, template):
    from reservations.checks import check_learner_email

    settings.RESERVATIONS_LEARNER_EMAIL = template
    (error,) = check_learner_email()
    assert error.id == "reservations.E001" and repr(template) in error.msg


def test_the_shipped_reminder_address_format_passes_its_check():
    from reservations.checks import check_learner_email

    assert check_learner_email() == []


def test_one_sender_run_opens_one_mail_connection_for_all_its_mails(section, settings):
    settings.EMAIL_BACKEND = f"{__name__}.CountingBackend"
    CountingBackend.opened = 0
    for n in range(3):
        made_ready(due_hold(section, f"learner-{n}"))

    assert send_ready_reminders() == {"sent": 3}
    assert CountingBackend.opened == 1 and len(mail.outbox) == 3
    assert send_ready_reminders() == {}
    assert CountingBackend.opened == 1  # nothing to send: no connection at all


class CountingBackend(LocmemBackend):
    opened = 0

    def open(self):
        if getattr(self, "_open", False):
            return False
        self._open = True
        CountingBackend.opened += 1
        return True


def test_reminders_of_holds_that_moved_on_are_cancelled_in_bulk_not_one_by_one(section):
    expired = [hold_seat(section.pk, f"late-{n}", now=timezone.now() - timedelta(minutes=20))
               for n in range(30)]
    confirmed = due_hold(section, "confirmed")
    due = due_hold(section, "due")
    for hold in (*expired, confirmed, due):
        made_ready(hold)
    SeatHold.objects.filter(pk=confirmed.pk).update(status="confirmed")  # a race, not the service

    with CaptureQueriesContext(connection) as queries:
        assert send_ready_reminders() == {"expired": 30, "confirmed": 1, "sent": 1}

    updates = [sql for _, sql in statements_on(Reminder._meta.db_table, queries)
               if sql.startswith("UPDATE")]
    # One per reason found (confirmed, expired), then the due one's claim and its sent
    # mark (one sent mark before the send stopped holding the row lock).
    assert len(updates) == 4
    # Each cancel carries its reason in its own WHERE, not only the ids read before it.
    cancels = [sql for sql in updates if "'cancelled'" in sql]
    assert len(cancels) == 2 and all('FROM "reservations_seathold"' in sql for sql in cancels)
    assert Reminder.objects.filter(state=CANCELLED).count() == 31
    assert [m.to for m in mail.outbox] == [["due@learners.example.edu"]]


def test_a_sender_run_past_its_time_budget_takes_no_more_reminders(section, settings):
    made_ready(due_hold(section))
    settings.RESERVATIONS_REMINDER_SEND_SECONDS = -1  # already spent when the run starts

    assert send_ready_reminders() == {}
    assert Reminder.objects.get().state == READY and mail.outbox == []
    settings.RESERVATIONS_REMINDER_SEND_SECONDS = 50
    assert send_ready_reminders() == {"sent": 1}
