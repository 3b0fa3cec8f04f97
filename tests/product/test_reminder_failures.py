"""A reminder that cannot be sent never stops reminder mail: against a real SMTP server in
the test process, a permanent refusal or an address that cannot be one fails that
reminder with its reason and the run goes on; a temporary failure leaves it ready for a
later run, and one that keeps failing gives up after RESERVATIONS_REMINDER_MAX_ATTEMPTS.
"""

from __future__ import annotations

import socketserver
import threading
import time
from contextlib import suppress
from email import message_from_bytes
from email.message import Message

import pytest
from django.urls import reverse

from reservations.checks import check_reminder_sending
from reservations.exceptions import SendingStopped
from reservations.models import Reminder, ReminderAttempt
from reservations.reminders import message_id, send_ready_reminders
from reservations.services import renew_hold
from tests.observability.test_metrics import scrape, value
from tests.product.test_reminders import due_hold, lead, made_ready, reminder_of

pytestmark = pytest.mark.django_db

SMTP = "django.core.mail.backends.smtp.EmailBackend"
CONSOLE = "django.core.mail.backends.console.EmailBackend"
READY, SENT, FAILED = Reminder.State.READY, Reminder.State.SENT, Reminder.State.FAILED
NO_SUCH_USER = "550 5.1.1 no such user"
TRY_LATER = "451 4.7.1 try again later"


class ScriptedSMTP:
    """A small SMTP server on 127.0.0.1: it answers each RCPT as ``script`` says for the
    address's local part (default ``250 OK``; ``"drop"`` closes the connection instead,
    ``"hang"`` answers after ``hang`` seconds), every reply ``delay`` seconds late, and
    keeps the mails it accepted."""

    def __init__(self, script: dict[str, str] | None = None, *, delay: float = 0.0,
                 hang: float = 2.0, sender_reply: str = "250 OK"):
        self.script = dict(script or {})
        self.delay, self.hang, self.sender_reply = delay, hang, sender_reply
        self.delivered: list[Message] = []
        self.rcpts: list[str] = []
        self.connected = threading.Event()
        self.connected_at: list[float] = []
        self.delivered_at: list[float] = []
        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Session)
        self._server.daemon_threads = True
        self._server.smtp = self

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def serve(self, settings) -> ScriptedSMTP:
        """Point Django's SMTP backend at this server."""
        settings.EMAIL_BACKEND = SMTP
        settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", self.port
        settings.EMAIL_HOST_USER = settings.EMAIL_HOST_PASSWORD = ""
        settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
        return self

    def __enter__(self) -> ScriptedSMTP:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def delivered_to(self) -> list[str]:
        return [m["To"] for m in self.delivered]


class _Session(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        smtp: ScriptedSMTP = self.server.smtp
        smtp.connected_at.append(time.monotonic())
        smtp.connected.set()
        with suppress(OSError):  # the client hung up (it timed out on a hanging reply)
            self._converse(smtp)

    def _converse(self, smtp: ScriptedSMTP) -> None:
        self.reply("220 scripted ESMTP", smtp)
        while line := self.rfile.readline():
            verb, _, argument = line.decode().rstrip("\r\n").partition(" ")
            verb = verb.upper()
            if verb in ("EHLO", "HELO"):
                self.reply("250 scripted", smtp)
            elif verb == "MAIL":
                self.reply(smtp.sender_reply, smtp)
            elif verb == "RCPT":
                address = argument.partition(":")[2].strip().strip("<>")
                smtp.rcpts.append(address)
                answer = smtp.script.get(address.partition("@")[0], "250 OK")
                if answer == "drop":
                    return
                if answer == "hang":
                    time.sleep(smtp.hang)
                    answer = "250 OK"
                self.reply(answer, smtp)
            elif verb == "DATA":
                self.reply("354 end with .", smtp)
                data = b"".join(iter(self.rfile.readline, b".\r\n"))
                smtp.delivered.append(message_from_bytes(data))
                smtp.delivered_at.append(time.monotonic())
                self.reply("250 queued", smtp)
            elif verb == "QUIT":
                self.reply("221 bye", smtp)
                return
            elif verb in ("RSET", "NOOP"):
                self.reply("250 OK", smtp)
            else:
                self.reply("502 not implemented", smtp)

    def reply(self, text: str, smtp: ScriptedSMTP) -> None:
        if smtp.delay:
            time.sleep(smtp.delay)
        self.wfile.write(text.encode() + b"\r\n")


@pytest.fixture
def smtp(settings):
    settings.EMAIL_TIMEOUT = 3
    with ScriptedSMTP() as server:
        yield server.serve(settings)


def ready_reminders(section, *learners: str) -> list[Reminder]:
    """Ready reminders in this order of due time (the sender takes the oldest first)."""
    return [made_ready(due_hold(section, learner)) for learner in learners]


def test_a_refused_address_fails_alone_and_the_run_sends_the_others(section, smtp):
    smtp.script["nobody"] = NO_SUCH_USER
    nobody, *others = ready_reminders(section, "nobody", *(f"learner-{n}" for n in range(9)))

    assert send_ready_reminders() == {"sent": 9, "failed": 1}

    refused = reminder_of(nobody.hold)
    assert (refused.state, refused.failure, refused.last_error) == (
        FAILED, Reminder.Failure.REFUSED, NO_SUCH_USER)
    assert sorted(m["Message-ID"] for m in smtp.delivered) == sorted(
        message_id(r) for r in others)
    assert set(Reminder.objects.exclude(pk=nobody.pk).values_list("state", flat=True)) == {SENT}
    assert ReminderAttempt.objects.count() == 9
    # Failed is final: the next runs do not knock on the same refusal again.
    assert send_ready_reminders() == {}
    assert smtp.rcpts.count("nobody@learners.example.edu") == 1


@pytest.mark.parametrize("backend", ["smtp", "console"])
@pytest.mark.parametrize("learner_ref", ["", "ada\nBcc: all@example.edu", "ada<x", "ada>x"],
                         ids=["empty", "newline", "lt", "gt"])
def test_an_address_that_cannot_be_one_fails_before_any_send_and_the_run_goes_on(
        section, smtp, settings, capsys, backend, learner_ref):
    if backend == "console":
        settings.EMAIL_BACKEND = CONSOLE
    unaddressable, fine = ready_reminders(section, learner_ref, "ada")

    assert send_ready_reminders() == {"sent": 1, "failed": 1}

    failed = reminder_of(unaddressable.hold)
    assert (failed.state, failed.failure) == (FAILED, Reminder.Failure.BAD_ADDRESS)
    address = f"{learner_ref}@learners.example.edu"
    assert failed.last_error == f"not a mail address: {address!r}"
    assert reminder_of(fine.hold).state == SENT
    if backend == "smtp":
        assert smtp.rcpts == ["ada@learners.example.edu"]
    else:
        assert capsys.readouterr().out.count("Message-ID: ") == 1


@pytest.mark.parametrize("answer, reason", [
    (TRY_LATER, TRY_LATER),
    ("drop", "SMTPServerDisconnected: Connection unexpectedly closed"),
    ("hang", "SMTPServerDisconnected: Connection unexpectedly closed: timed out"),
], ids=["4xx", "dropped-connection", "timeout"])
def test_a_temporary_failure_leaves_the_reminder_ready_and_the_run_goes_on(
        section, smtp, settings, answer, reason):
    settings.EMAIL_TIMEOUT = 0.5
    smtp.hang = 1.0
    smtp.script["flaky"] = answer
    flaky, *others = ready_reminders(section, "flaky", "ada", "bob")

    assert send_ready_reminders() == {"sent": 2, "deferred": 1}

    deferred = reminder_of(flaky.hold)
    assert (deferred.state, deferred.attempts, deferred.last_error) == (READY, 1, reason)
    assert sorted(smtp.delivered_to()) == ["ada@learners.example.edu", "bob@learners.example.edu"]
    # A run of its own later, once the server takes it: the same mail, the same key.
    del smtp.script["flaky"]
    assert send_ready_reminders() == {"sent": 1}
    assert smtp.delivered[-1]["Message-ID"] == message_id(flaky)
    assert reminder_of(flaky.hold).state == SENT


def test_one_run_tries_a_temporarily_failing_reminder_once(section, smtp):
    smtp.script["flaky"] = TRY_LATER
    ready_reminders(section, "flaky")

    assert send_ready_reminders(batch=10) == {"deferred": 1}
    assert smtp.rcpts == ["flaky@learners.example.edu"]


def test_a_reminder_that_keeps_failing_temporarily_gives_up_after_the_max_attempts(
        section, smtp, settings):
    settings.RESERVATIONS_REMINDER_MAX_ATTEMPTS = 3
    smtp.script["flaky"] = TRY_LATER
    (flaky,) = ready_reminders(section, "flaky")

    assert [send_ready_reminders() for _ in range(4)] == [
        {"deferred": 1}, {"deferred": 1}, {"failed": 1}, {}]

    given_up = reminder_of(flaky.hold)
    assert (given_up.state, given_up.failure, given_up.attempts) == (
        FAILED, Reminder.Failure.GAVE_UP, 3)
    assert given_up.last_error == f"gave up after 3 attempts; the last: {TRY_LATER}"
    assert smtp.rcpts.count("flaky@learners.example.edu") == 3


def test_a_renewal_makes_a_failed_reminder_due_again_with_attempts_of_its_own(
        section, smtp, settings):
    settings.RESERVATIONS_REMINDER_MAX_ATTEMPTS = 1
    smtp.script["flaky"] = TRY_LATER
    (flaky,) = ready_reminders(section, "flaky")
    assert send_ready_reminders() == {"failed": 1}

    renewed = renew_hold(flaky.hold_id)

    again = reminder_of(flaky.hold)
    assert (again.state, again.due_at) == (Reminder.State.PENDING, renewed.expires_at - lead())
    assert (again.attempts, again.failure, again.last_error, again.claimed_at) == (
        0, "", "", None)


def test_temporary_failures_stay_within_the_run_time_budget(section, smtp, settings):
    settings.EMAIL_TIMEOUT = 0.5
    settings.RESERVATIONS_REMINDER_SEND_SECONDS = 0.3  # spent by the first time-out
    smtp.hang = 1.0
    smtp.script.update({"slow-0": "hang", "slow-1": "hang"})
    first, second = ready_reminders(section, "slow-0", "slow-1")

    assert send_ready_reminders() == {"deferred": 1}
    assert (reminder_of(second.hold).state, reminder_of(second.hold).attempts) == (READY, 0)


def test_an_unreachable_mail_server_stops_the_run_and_charges_no_reminder(section, settings):
    with ScriptedSMTP() as gone:
        port = gone.port
    settings.EMAIL_BACKEND, settings.EMAIL_HOST, settings.EMAIL_PORT = SMTP, "127.0.0.1", port
    reminders = ready_reminders(section, "ada", "bob")

    with pytest.raises(SendingStopped, match="ConnectionRefusedError") as stopped:
        send_ready_reminders()

    assert stopped.value.outcomes == {}
    assert [(reminder_of(r.hold).state, reminder_of(r.hold).attempts) for r in reminders] == [
        (READY, 0), (READY, 0)]


def test_a_refused_sender_stops_the_run_and_fails_no_reminder(section, smtp):
    # The server refuses our From address: every reminder would fail the same way.
    smtp.sender_reply = "553 5.7.1 sender not allowed"
    reminders = ready_reminders(section, "ada", "bob")

    with pytest.raises(SendingStopped, match="553 5.7.1 sender not allowed"):
        send_ready_reminders()

    assert {reminder_of(r.hold).state for r in reminders} == {READY}
    assert Reminder.objects.filter(attempts__gt=0).count() == 0


def test_failed_reminders_are_counted_on_metrics_by_reason(client, section, smtp, settings):
    settings.RESERVATIONS_REMINDER_MAX_ATTEMPTS = 1
    smtp.script.update({"nobody": NO_SUCH_USER, "flaky": TRY_LATER})
    before = scrape(client)
    ready_reminders(section, "nobody", "flaky", "", "ada")

    assert send_ready_reminders() == {"sent": 1, "failed": 3}

    after = scrape(client)
    for reason in ("refused", "gave_up", "bad_address"):
        labels = {"reason": reason}
        assert value(after, "reservations_reminders_failed", **labels) - value(
            before, "reservations_reminders_failed", **labels) == 1


def test_the_console_shows_a_failed_reminder_and_its_reason(admin_client, section, smtp):
    smtp.script["nobody"] = NO_SUCH_USER
    (nobody,) = ready_reminders(section, "nobody")
    send_ready_reminders()

    page = admin_client.get(reverse("admin:reservations_reminder_changelist")).content.decode()
    assert ">failed</span>" in page and NO_SUCH_USER in page
    detail = admin_client.get(reverse("admin:reservations_reminder_change",
                                      args=[nobody.pk])).content.decode()
    assert NO_SUCH_USER in detail


@pytest.mark.parametrize("setting, value_, refused", [
    ("RESERVATIONS_REMINDER_MAX_ATTEMPTS", 5, False),
    ("RESERVATIONS_REMINDER_MAX_ATTEMPTS", 0, True),
    ("RESERVATIONS_REMINDER_MAX_ATTEMPTS", "5", True),
    ("RESERVATIONS_REMINDER_MAX_ATTEMPTS", 40_000, True),  # past the attempts column
    ("RESERVATIONS_REMINDER_CLAIM_SECONDS", 300, False),
    ("RESERVATIONS_REMINDER_CLAIM_SECONDS", 60, True),  # inside the 120 s task timeout
    ("RESERVATIONS_REMINDER_CLAIM_SECONDS", None, True),
])
def test_reminder_sending_settings_that_cannot_work_are_refused(settings, setting, value_,
                                                                refused):
    setattr(settings, setting, value_)
    ids = {"RESERVATIONS_REMINDER_MAX_ATTEMPTS": "reservations.E003",
           "RESERVATIONS_REMINDER_CLAIM_SECONDS": "reservations.E004"}
    errors = check_reminder_sending()
    assert [e.id for e in errors] == ([ids[setting]] if refused else [])
    assert all(setting in e.msg for e in errors)

