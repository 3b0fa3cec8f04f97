"""The waitlist (issue 34 item 4): a seat freed by cleanup's chunk or by the learner's
release is offered, once, to the first learner waiting, with a mail whose Message-ID is
on record once; an offer not confirmed lapses through the same cleanup and goes on;
nobody outside the line takes a seat learners wait for."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import mail
from django.urls import reverse
from django.utils import timezone

from cleanup.engine.dispatch import dispatch
from cleanup.engine.replay import replay
from cleanup.engine.worker import Outcome, apply_chunk
from cleanup.models import Event
from cleanup.outbox import publish, registered
from reservations.checks import check_offer_window
from reservations.exceptions import (
    AlreadySeated,
    NotAMailAddress,
    SeatAvailable,
    SectionFull,
    WaitlistAhead,
)
from reservations.models import FreedSeat, OfferMail, Reminder, SeatHold, WaitlistEntry
from reservations.services import confirm_hold, hold_seat, release_hold, seats_taken
from reservations.waitlist import join_waitlist, leave_waitlist, offer_freed_seat
from tests.factories import SeatHoldFactory, SectionFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def full():
    """A section of two seats, both held, and two learners waiting: ann, then bob."""
    section = SectionFactory(capacity=2, title="Statistics 101")
    holds = SeatHoldFactory.create_batch(2, section=section)
    ann = join_waitlist(section.pk, "ann")
    bob = join_waitlist(section.pk, "bob")
    return section, holds, ann, bob


def expire(*holds: SeatHold) -> None:
    SeatHold.objects.filter(pk__in=[h.pk for h in holds]).update(
        expires_at=timezone.now() - timedelta(minutes=1))


def clean_up():
    """One run of expire-holds, its one chunk applied; the chunk."""
    chunk = dispatch("expire-holds").run.chunks.get()
    assert apply_chunk(chunk.message) == Outcome.DELETED
    return chunk


def offer_of(entry: WaitlistEntry) -> SeatHold:
    entry.refresh_from_db()
    return SeatHold.objects.get(pk=entry.offer_hold_id)


def test_a_hold_expired_by_cleanup_is_offered_to_the_first_learner_waiting(full, settings):
    settings.RESERVATIONS_OFFER_MINUTES = 20
    section, (gone, _), ann, bob = full
    expire(gone)
    mail.outbox.clear()

    chunk = clean_up()

    event = Event.objects.get()
    assert (event.name, event.key, event.ordering_key) == (
        "reservations.seat_freed", f"seathold:{gone.pk}", f"section:{section.pk}")
    assert event.payload == {"hold_id": gone.pk, "section_id": section.pk,
                             "learner_ref": gone.learner_ref}
    assert (event.source, event.run_id, event.chunk_id) == (
        f"run {chunk.run_id} chunk 1", chunk.run_id, 1)

    before = timezone.now()
    assert publish().delivered == 1

    offer = offer_of(ann)
    assert (ann.state, offer.learner_ref, offer.status) == ("offered", "ann", "held")
    assert before + timedelta(minutes=20) <= offer.expires_at <= timezone.now() + timedelta(
        minutes=20)
    assert (ann.offer_event_key, ann.offered_at is not None) == (event.dedup_id, True)
    assert Reminder.objects.filter(hold_id=offer.pk, state="pending").exists()
    bob.refresh_from_db()
    assert bob.state == "waiting"
    [sent] = mail.outbox
    until = offer.expires_at.strftime("%H:%M UTC")
    assert sent.to == ["ann@learners.example.edu"]
    assert sent.body == (f"A seat in Statistics 101 is yours until {until}. Confirm it "
                         "before then, or it goes to the next learner.")
    assert sent.extra_headers["Message-ID"] == f"<seat-offer-{event.pk}-{ann.pk}@example.edu>"
    assert list(OfferMail.objects.values_list("message_id", "entry")) == [
        (sent.extra_headers["Message-ID"], ann.pk)]
    assert list(FreedSeat.objects.values_list("event_key", "hold_id", "outcome", "entry")) == [
        (event.dedup_id, gone.pk, "offered", ann.pk)]
    assert seats_taken(section.pk, timezone.now()) == 2


def test_a_learners_release_frees_the_seat_as_the_hosts_and_it_is_offered(full):
    section, (released, _), ann, _ = full

    assert release_hold(released.pk) is True

    event = Event.objects.get()
    assert (event.key, event.source, event.run_id, event.chunk_id) == (
        f"seathold:{released.pk}", "host", None, None)
    publish()
    assert offer_of(ann).learner_ref == "ann"
    assert FreedSeat.objects.get().outcome == "offered"


def test_an_offer_not_confirmed_in_time_lapses_through_cleanup_and_goes_to_the_next(full):
    section, (gone, _), ann, bob = full
    expire(gone)
    clean_up()
    publish()
    offer = offer_of(ann)

    expire(offer)  # ann never confirmed it
    chunk = clean_up()
    assert Event.objects.get(key=f"seathold:{offer.pk}").chunk_id == chunk.chunk_id
    publish()

    ann.refresh_from_db()
    assert ann.state == "lapsed"
    assert offer_of(bob).learner_ref == "bob"
    assert bob.state == "offered"
    assert sorted(FreedSeat.objects.values_list("hold_id", "entry")) == sorted(
        [(gone.pk, ann.pk), (offer.pk, bob.pk)])


def test_the_last_offer_lapsing_with_nobody_waiting_records_it_and_frees_the_seat(full):
    section, (gone, _), ann, bob = full
    leave_waitlist(bob.pk)
    expire(gone)
    clean_up()
    publish()
    expire(offer := offer_of(ann))
    clean_up()
    publish()

    freed = FreedSeat.objects.get(hold_id=offer.pk)
    assert (freed.outcome, freed.entry) == ("nobody_waiting", None)
    assert hold_seat(section.pk, "walk-in").learner_ref == "walk-in"


def test_cleanup_in_a_section_without_a_waitlist_writes_no_event(expired_holds):
    clean_up()
    assert not SeatHold.objects.filter(pk__in=[h.pk for h in expired_holds]).exists()
    assert Event.objects.count() == 0


def test_nobody_outside_the_waitlist_takes_a_freed_seat_and_the_offered_learner_confirms(
        full):
    section, (released, _), ann, bob = full
    release_hold(released.pk)

    # Freed, not yet offered: the seat is the waitlist's.
    with pytest.raises(WaitlistAhead, match="learner.* on its waitlist come first"):
        hold_seat(section.pk, "walk-in")
    with pytest.raises(WaitlistAhead):  # nor a hold that expired before it
        confirm_hold(SeatHoldFactory(section=section, expired=True).pk)
    publish()
    with pytest.raises(SectionFull):
        hold_seat(section.pk, "walk-in")

    offer = offer_of(ann)
    assert hold_seat(section.pk, "ann") == offer  # theirs already, not a second seat
    assert confirm_hold(offer.pk).status == "confirmed"
    ann.refresh_from_db()
    assert ann.state == "confirmed"
    assert SeatHold.objects.filter(section=section, learner_ref="ann").count() == 1
    assert seats_taken(section.pk, timezone.now()) == 2


def test_seats_free_beyond_the_learners_waiting_are_anyones():
    section = SectionFactory(capacity=3)
    held = SeatHoldFactory.create_batch(3, section=section)
    join_waitlist(section.pk, "ann")
    release_hold(held[0].pk)
    publish()  # offered to ann
    release_hold(held[1].pk)
    publish()  # nobody waiting

    with pytest.raises(SeatAvailable):  # never both refused
        join_waitlist(section.pk, "walk-in")
    assert hold_seat(section.pk, "walk-in").learner_ref == "walk-in"
    assert list(FreedSeat.objects.order_by("pk").values_list("outcome", flat=True)) == [
        "offered", "nobody_waiting"]


def test_joining_is_refused_while_a_seat_is_free_or_held_and_idempotent_otherwise(full):
    section, (held, _), ann, _ = full
    assert join_waitlist(section.pk, "ann") == ann
    with pytest.raises(AlreadySeated):
        join_waitlist(section.pk, held.learner_ref)
    with pytest.raises(NotAMailAddress):
        join_waitlist(section.pk, "no address")
    with pytest.raises(SeatAvailable, match="hold the seat instead"):
        join_waitlist(SectionFactory(capacity=1).pk, "ann")


def test_a_learner_who_leaves_with_an_offer_passes_the_seat_to_the_next(full):
    section, (released, _), ann, bob = full
    release_hold(released.pk)
    publish()
    offer = offer_of(ann)

    assert leave_waitlist(ann.pk).state == "left"
    assert leave_waitlist(ann.pk).state == "left"
    assert not SeatHold.objects.filter(pk=offer.pk).exists()
    publish()

    assert offer_of(bob).learner_ref == "bob"
    assert FreedSeat.objects.get(hold_id=offer.pk).entry_id == bob.pk


def test_a_chunk_delivered_twice_and_replayed_offers_the_seat_once(full):
    section, (gone, _), ann, _ = full
    expire(gone)
    chunk = clean_up()
    assert apply_chunk(chunk.message) == Outcome.NOOP
    assert replay(chunk.run_id).resent == 1
    assert apply_chunk(chunk.message) == Outcome.NOOP
    publish()
    publish()

    assert Event.objects.count() == 1
    assert (FreedSeat.objects.count(), OfferMail.objects.count(), len(mail.outbox)) == (1, 1, 1)
    assert WaitlistEntry.objects.filter(state="offered").count() == 1
    assert SeatHold.objects.filter(learner_ref="ann").count() == 1


def test_an_event_handled_twice_offers_once(full):
    section, (released, _), ann, bob = full
    release_hold(released.pk)
    event = Event.objects.get()

    offer_freed_seat(event)
    offer_freed_seat(event)

    assert (FreedSeat.objects.count(), OfferMail.objects.count(), len(mail.outbox)) == (1, 1, 1)
    assert list(WaitlistEntry.objects.order_by("pk").values_list("state", flat=True)) == [
        "offered", "waiting"]
    assert SeatHold.objects.filter(learner_ref__in=("ann", "bob")).count() == 1


def test_a_publisher_crash_after_the_mail_resends_it_under_the_same_message_id(full):
    section, (released, _), ann, _ = full
    release_hold(released.pk)

    def mail_then_crash(event):
        offer_freed_seat(event)
        assert len(mail.outbox) == 1  # the mail left
        raise RuntimeError("the publisher died before its commit")

    with registered(**{"reservations.seat_freed": mail_then_crash}):
        assert publish().failed == 1
    assert (FreedSeat.objects.count(), OfferMail.objects.count()) == (0, 0)
    assert not SeatHold.objects.filter(learner_ref="ann").exists()

    assert publish(now=timezone.now() + timedelta(hours=1)).delivered == 1

    first, second = mail.outbox
    assert first.extra_headers["Message-ID"] == second.extra_headers["Message-ID"]
    assert list(OfferMail.objects.values_list("message_id", flat=True)) == [
        first.extra_headers["Message-ID"]]
    assert (FreedSeat.objects.count(), SeatHold.objects.filter(learner_ref="ann").count()) == (
        1, 1)


@pytest.mark.parametrize("minutes, refused", [(30, False), (1, False), (0, True),
                                              (1441, True), ("30", True), (2.5, True)])
def test_e005_an_offer_window_that_cannot_work_is_refused(settings, minutes, refused):
    settings.RESERVATIONS_OFFER_MINUTES = minutes
    errors = check_offer_window()
    assert [e.id for e in errors] == (["reservations.E005"] if refused else [])
    assert all("RESERVATIONS_OFFER_MINUTES" in e.msg for e in errors)


def test_the_admin_joins_a_learner_through_the_service_and_lists_the_ledgers(admin_client,
                                                                            full):
    section, (released, _), _, _ = full
    url = reverse("admin:reservations_waitlistentry_add")

    answer = admin_client.post(url, {"section": section.pk, "learner_ref": "cleo"})
    assert answer.status_code == 302
    assert WaitlistEntry.objects.get(learner_ref="cleo").state == "waiting"
    refused = admin_client.post(url, {"section": SectionFactory(capacity=5).pk,
                                      "learner_ref": "dan"})
    assert "hold the seat instead" in refused.content.decode()

    release_hold(released.pk)
    publish()
    for model in ("waitlistentry", "freedseat", "offermail"):
        page = admin_client.get(reverse(f"admin:reservations_{model}_changelist"))
        assert page.status_code == 200, model
    assert "offered" in admin_client.get(
        reverse("admin:reservations_freedseat_changelist")).content.decode()
