"""The product's services, including the renewal race cleanup must respect."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from reservations.exceptions import HoldNotFound, HoldNotRenewable, SectionFull
from reservations.models import SeatHold
from reservations.services import confirm_hold, hold_seat, release_hold, renew_hold
from tests.factories import SeatHoldFactory, SectionFactory

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
