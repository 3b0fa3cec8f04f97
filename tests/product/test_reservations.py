"""The product's services, including the renewal race cleanup must respect, and the
product's own cleanup policies (the engine's rules are pinned on tests/engine_app)."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.urls import reverse
from django.utils import timezone
from django_q.models import Schedule

from cleanup.engine.dispatch import dispatch
from cleanup.engine.worker import Outcome, apply_chunk
from cleanup.scheduling.schedules import install_schedules
from reservations.exceptions import HoldNotFound, HoldNotRenewable, SectionFull
from reservations.models import ReminderAttempt, SeatHold, Tenant
from reservations.services import confirm_hold, hold_seat, release_hold, renew_hold
from tests.factories import (
    ReminderAttemptFactory,
    SeatHoldFactory,
    SectionFactory,
    TenantFactory,
)

pytestmark = pytest.mark.django_db


def test_hold_seat_refuses_a_full_section():
    section = SectionFactory(capacity=2)
    hold_seat(section.pk, "a")
    SeatHoldFactory(section=section, status="confirmed")

    with pytest.raises(SectionFull, match="is full"):
        hold_seat(section.pk, "c")
    assert SeatHold.objects.count() == 2


def test_expired_holds_do_not_count_against_capacity():
    section = SectionFactory(capacity=1)
    SeatHoldFactory(section=section, expired=True)
    hold = hold_seat(section.pk, "b")
    assert hold.expires_at > timezone.now()


def test_renew_moves_expiry_forward_even_past_expiry():
    hold = SeatHoldFactory(expired=True)
    renewed = renew_hold(hold.pk)
    assert renewed.expires_at > timezone.now() + timedelta(minutes=14)


def test_renew_of_expired_hold_refused_when_its_seat_was_taken():
    section = SectionFactory(capacity=1)
    hold = SeatHoldFactory(section=section, expired=True)
    hold_seat(section.pk, "newcomer")
    with pytest.raises(SectionFull):
        renew_hold(hold.pk)


def test_renew_refused_once_confirmed_or_gone():
    hold = SeatHoldFactory(status="confirmed")
    with pytest.raises(HoldNotRenewable, match="confirmed"):
        renew_hold(hold.pk)
    with pytest.raises(HoldNotFound):
        renew_hold(hold.pk + 1000)


def test_confirm_is_idempotent():
    hold = SeatHoldFactory()
    confirm_hold(hold.pk)
    assert confirm_hold(hold.pk).status == "confirmed"


def test_release_deletes_a_held_seat_once():
    hold = SeatHoldFactory()
    assert release_hold(hold.pk) is True
    assert release_hold(hold.pk) is False


def test_release_refuses_a_confirmed_seat():
    hold = SeatHoldFactory(status="confirmed")
    with pytest.raises(HoldNotRenewable):
        release_hold(hold.pk)
    assert SeatHold.objects.filter(pk=hold.pk).exists()


def test_a_hold_renewed_or_confirmed_after_planning_survives_its_chunk(expired_holds):
    renewed, confirmed, *others = expired_holds
    (chunk,) = dispatch("expire-holds").run.chunks.all()
    renew_hold(renewed.pk)
    confirm_hold(confirmed.pk)

    assert apply_chunk(chunk.message) == Outcome.DELETED

    chunk.refresh_from_db()
    assert set(SeatHold.objects.values_list("pk", flat=True)) == {renewed.pk, confirmed.pk}
    assert (chunk.rows_deleted, chunk.items_skipped) == (3, 2)


def test_expire_holds_logs_its_idempotency_keys_under_the_reservation_prefix(expired_holds,
                                                                            caplog):
    (chunk,) = dispatch("expire-holds").run.chunks.all()
    hold = expired_holds[0]

    with caplog.at_level("DEBUG", logger="cleanup.worker"):
        apply_chunk(chunk.message)

    keys = [r.msg["idempotency_key"] for r in caplog.records
            if isinstance(r.msg, dict) and "idempotency_key" in r.msg]
    assert f"expire-reservation:{hold.pk}:{hold.expires_at.isoformat()}" in keys
    assert len(keys) == 5


@pytest.mark.usefixtures("row_locks_waited")
@pytest.mark.django_db(transaction=True)  # the renewal holds its lock from a second connection
@pytest.mark.parametrize("scheme", ["items", "range"])
def test_renew_hold_holding_the_row_lock_survives_a_waiting_delete(scheme):
    import threading

    from tests.conftest import wait_for
    from tests.engine.test_concurrency import Worker, hold_lock_while, waiting_statements

    hold = SeatHoldFactory(expired=True)
    chunk = dispatch("expire-holds", scheme=scheme).run.chunks.get()
    renewed, release = threading.Event(), threading.Event()
    renewer = Worker(hold_lock_while, hold.pk, renewed, release, renew_hold)
    renewer.start()
    assert renewed.wait(10)
    deleter = Worker(apply_chunk, chunk.message)
    deleter.start()
    wait_for(lambda: waiting_statements("DELETE") == 1, what="the DELETE to wait on the row lock")
    release.set()

    assert renewer.outcome() is None
    assert deleter.outcome() == Outcome.NOOP
    assert SeatHold.objects.filter(pk=hold.pk).exists()
    chunk.refresh_from_db()
    assert (chunk.state, chunk.rows_deleted, chunk.items_skipped) == ("committed", 0, 1)


def test_the_reminder_purge_freezes_its_retention_setting_at_dispatch(settings):
    settings.RESERVATIONS_REMINDER_RETENTION_DAYS = 30
    now = timezone.now()
    old, recent = (ReminderAttemptFactory(sent_at=now - timedelta(days=days)) for days in (40, 20))
    run = dispatch("purge-reminder-attempts").run
    assert run.parameters == {"sent_before": (run.cutoff - timedelta(days=30)).isoformat()}

    settings.RESERVATIONS_REMINDER_RETENTION_DAYS = 10  # the worker's own settings
    for chunk in run.chunks.all():
        assert apply_chunk(chunk.message) == Outcome.DELETED

    assert list(ReminderAttempt.objects.values_list("pk", flat=True)) == [recent.pk]


def test_the_hold_admin_and_the_metrics_read_infinite_expiries(client, admin_client, section):
    from tests.observability.test_metrics import scrape, value

    odd = {}
    for expiry in ("-infinity", "4713-01-01 00:00:00+00 BC", "infinity"):
        hold = SeatHoldFactory(section=section)
        with connection.cursor() as cursor:
            cursor.execute(f"UPDATE {SeatHold._meta.db_table} SET expires_at = %s::timestamptz "
                           "WHERE id = %s", [expiry, hold.pk])
        odd[expiry] = hold.pk

    assert value(scrape(client), "cleanup_oldest_eligible_age_seconds",
                 policy="expire-holds") > 60e9
    for url in (reverse("admin:reservations_seathold_changelist"),
                *(reverse("admin:reservations_seathold_change", args=[pk])
                  for pk in odd.values())):
        assert admin_client.get(url).status_code == 200, url


def test_seeding_again_after_a_tenant_was_deleted_picks_free_names(db):
    seed = ["seed_reservations", "--tenants", "2", "--expired", "1", "--active", "1"]
    call_command(*seed, stdout=StringIO())
    TenantFactory(name="Institution 4")
    Tenant.objects.filter(name="Institution 1").delete()
    call_command(*seed, stdout=StringIO())
    assert sorted(Tenant.objects.values_list("name", flat=True)) == [
        "Institution 1", "Institution 2", "Institution 3", "Institution 4"]


def test_the_product_expires_holds_each_minute_and_purges_reminder_attempts_hourly(db):
    install_schedules()
    crons = dict(Schedule.objects.filter(name__in=[
        "cleanup:expire-holds", "cleanup:mark-reminders-ready",
        "cleanup:purge-reminder-attempts"]).values_list("name", "cron"))
    assert crons == {"cleanup:expire-holds": "* * * * *",
                     "cleanup:mark-reminders-ready": "* * * * *",
                     "cleanup:purge-reminder-attempts": "15 * * * *"}


def test_cleanup_policies_lists_the_product_policies_by_what_they_do(db):
    out = StringIO()
    call_command("cleanup_policies", stdout=out)
    headings = [line for line in out.getvalue().splitlines()
                if line.startswith(("expire-holds ", "mark-reminders-ready ",
                                    "purge-reminder-attempts "))]
    assert headings == [
        "expire-holds (delete reservations.SeatHold, items chunks, window 4)",
        "mark-reminders-ready (update reservations.Reminder, items chunks, window 4)",
        "purge-reminder-attempts (delete reservations.ReminderAttempt, range chunks, window 4)",
    ]
