"""``send_reminders`` run as an operator runs it: a real ``manage.py`` subprocess.

transaction=True: the subprocess connects to the test database on its own and must see
the reminders this test committed.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from reservations.models import Reminder
from reservations.reminders import message_id
from tests.conftest import ROOT, subprocess_env
from tests.factories import SectionFactory
from tests.product.test_reminders import due_hold, made_ready, reminder_of

pytestmark = pytest.mark.django_db(transaction=True)

CONSOLE = "django.core.mail.backends.console.EmailBackend"


def send_reminders(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "send_reminders", *args],
        cwd=ROOT, env=subprocess_env(**{"DJANGO_EMAIL_BACKEND": CONSOLE, **env}),
        capture_output=True, text=True, timeout=120,
    )


NO_MAIL_SERVER = {"DJANGO_EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend",
                  "EMAIL_HOST": "127.0.0.1", "EMAIL_PORT": "1"}


@pytest.mark.parametrize("json_output", [False, True], ids=["text", "--json"])
def test_with_no_mail_server_the_refusal_is_the_only_line_on_stderr(json_output):
    made_ready(due_hold(SectionFactory(), "ada"))

    process = send_reminders(*(["--json"] if json_output else []), **NO_MAIL_SERVER)

    assert (process.returncode, process.stdout) == (1, "")
    (line,) = process.stderr.splitlines()
    refusal = json.loads(line)["error"] if json_output else line
    assert "sending stopped: no reminder can be sent now (ConnectionRefusedError" in refusal


def test_send_reminders_json_prints_one_json_object_and_the_mails_elsewhere():
    section = SectionFactory()
    sent = made_ready(due_hold(section, "ada"))
    unaddressable = made_ready(due_hold(section, "ada\nBcc: all@example.edu"))

    process = send_reminders("--json")

    assert process.returncode == 0, process.stderr
    assert json.loads(process.stdout) == {"sent": 1, "not_sent": {"failed": 1}}
    # The console backend's mail went to stderr, where an operator still sees it.
    assert f"Message-ID: {message_id(sent)}" in process.stderr
    assert reminder_of(unaddressable.hold).state == Reminder.State.FAILED


def test_send_reminders_without_json_prints_the_mails_and_names_each_failure():
    section = SectionFactory()
    sent = made_ready(due_hold(section, "ada"))
    unaddressable = made_ready(due_hold(section, "ada<x"))

    process = send_reminders()

    assert process.returncode == 0, process.stderr
    assert f"Message-ID: {message_id(sent)}" in process.stdout
    assert process.stdout.strip().splitlines()[-2:] == [
        "Sent 1 reminder; not sent: 1 failed.",
        f"Failed: reminder {unaddressable.pk} (hold {unaddressable.hold_id}): not a mail "
        "address: 'ada<x@learners.example.edu'",
    ]
