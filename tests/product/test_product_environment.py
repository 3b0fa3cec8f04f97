"""What the environment does to the product's commands: an email backend that cannot be
imported, and seeding's progress lines."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from reservations.checks import check_email_backend
from tests.commands.test_cli_environment import shell


def test_an_email_backend_that_cannot_be_imported_fails_check_e002(settings):
    settings.EMAIL_BACKEND = "no.such.Backend"
    (error,) = check_email_backend()
    assert (error.id, error.msg) == (
        "reservations.E002", "EMAIL_BACKEND 'no.such.Backend' cannot be imported (No module "
        "named 'no'), so no reminder can be sent.")
    assert "DJANGO_EMAIL_BACKEND" in error.hint
    settings.EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"
    assert check_email_backend() == []


@pytest.mark.django_db
def test_a_bad_email_backend_stops_the_sender_with_the_check_not_a_traceback():
    result = shell("send_reminders", DJANGO_EMAIL_BACKEND="no.such.Backend")
    assert (result.returncode, result.stdout) == (1, "")
    assert "Traceback" not in result.stderr
    assert ("(reservations.E002) EMAIL_BACKEND 'no.such.Backend' cannot be imported"
            in result.stderr)


@pytest.mark.django_db
def test_seeding_progress_is_plain_output_not_an_error(monkeypatch):
    def seed(progress, **counts):
        progress("holds", 100_000, 200_000)
        return dict.fromkeys(("tenants", "sections", "expired", "active", "confirmed",
                              "reminders", "attempts"), 0)

    monkeypatch.setattr("reservations.seeding.seed", seed)
    out, err = StringIO(), StringIO()
    call_command("seed_reservations", "--tenants", "1", "--expired", "200000", "--active",
                 "0", stdout=out, stderr=err)
    assert out.getvalue().splitlines()[0] == "  holds: 100,000/200,000"
    assert err.getvalue() == ""
