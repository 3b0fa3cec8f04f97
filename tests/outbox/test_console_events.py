"""The outbox's events in the console: the list (counted no further than its cap,
searched through the (name, key) index), an event's page, and the requeue and discard
of dead events through the two-step confirmation, each changing an event once."""

from __future__ import annotations

import re
from datetime import timedelta

import factory
import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from cleanup.engine.dispatch import dispatch
from cleanup.models import Chunk, Event, Run
from cleanup.outbox import emit, publish, registered
from tests.engine_app.factories import LeaseFactory

pytestmark = pytest.mark.django_db

EVENTS = reverse("admin:cleanup_event_changelist")
HOSTILE = "<script>alert('x')</script>"


class EventFactory(factory.django.DjangoModelFactory):
    """An event as the publisher leaves it; ``dead=True``: out of attempts, with its error."""

    class Meta:
        model = Event

    class Params:
        dead = factory.Trait(state=Event.State.DEAD, attempts=10,
                             cause="ValueError: mail server refused",
                             last_error="Traceback (most recent call last):\n"
                                        "ValueError: mail server refused")

    name = "lease.expired"
    key = factory.Sequence(lambda n: f"lease:{n}")
    ordering_key = "account:1"
    payload = factory.LazyAttribute(lambda event: {"lease": event.key})
    state = Event.State.DELIVERED
    delivered_at = factory.LazyFunction(timezone.now)


def dead_by_its_handler(settings) -> Event:
    """An event dead-lettered for real: its handler raised once, the only attempt."""
    settings.CLEANUP_EVENT_MAX_ATTEMPTS = 1

    def refuse(event):
        raise ValueError(f"mail server refused {HOSTILE}")

    with transaction.atomic():
        emit("mail.offer", "lease:666", {"note": HOSTILE, "holder": "ada"},
             ordering_key="account:9")
    with registered(**{"mail.offer": refuse}):
        assert publish().dead == 1
    return Event.objects.get(name="mail.offer")


def page_of(client, event: Event) -> str:
    response = client.get(reverse("admin:cleanup_event_change", args=[event.pk]))
    assert response.status_code == 200
    return response.content.decode()


def listed(response) -> list[int]:
    return [event.pk for event in response.context["cl"].result_list]


def action(client, name: str, pks, **extra):
    return client.post(EVENTS, {"action": name, "_selected_action": [str(p) for p in pks],
                                **extra}, follow=True)


def texts(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def staff(client, *codenames: str) -> User:
    user = User.objects.create_user("op", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="cleanup",
                                                        codename__in=codenames))
    client.force_login(user)
    return user


# The list


def test_the_list_shows_each_event_newest_first_with_its_state_and_what_failed(admin_client):
    delivered = EventFactory(key="lease:1")
    dead = EventFactory(key="lease:2", dead=True, delivered_at=None)
    retrying = EventFactory(name="lease.noticed", key="lease:3", ordering_key="",
                            state=Event.State.PENDING, attempts=2, delivered_at=None,
                            cause="OperationalError: lock timeout")

    response = admin_client.get(EVENTS)
    page = response.content.decode()

    assert listed(response) == [retrying.pk, dead.pk, delivered.pk]
    assert ">dead</span>" in page and "state-dead-lettered" in page
    assert ">delivered</span>" in page and ">retrying</span>" in page
    assert "<small>2 of 10 attempts failed</small>" in page  # the pending one: 8 to go
    assert "<small>10 attempts failed</small>" in page
    assert "lease:2" in page and "account:1" in page
    # The dead one's cause (its whole line on hover), and why the pending one is retried.
    assert page.count('">ValueError: mail server refused</span>') == 1
    assert '">OperationalError: lock timeout</span>' in page
    assert "3 events" in page


def test_the_source_links_the_run_and_the_chunk_that_wrote_the_event(admin_client, account):
    LeaseFactory(account=account, expired=True)
    chunk = dispatch("expire-leases").run.chunks.get()
    written = EventFactory(run_id=chunk.run_id, chunk_id=chunk.chunk_id,
                           source=f"run {chunk.run_id} chunk {chunk.chunk_id}")
    EventFactory(key="lease:host")
    follow = reverse("admin:cleanup_event_chunk", args=[written.pk])

    page = admin_client.get(EVENTS).content.decode()

    assert reverse("admin:cleanup_run_change", args=[chunk.run_id]) in page
    assert f'<a href="{follow}">#{chunk.chunk_id}</a>' in page
    assert ">host<" in page
    assert admin_client.get(follow)["Location"] == reverse("admin:cleanup_chunk_change",
                                                           args=[chunk.pk])
    Chunk.objects.filter(pk=chunk.pk).delete()  # the ledger's purge
    Run.objects.filter(pk=chunk.run_id).delete()
    purged = admin_client.get(follow, follow=True)
    assert texts(purged) == [f"Chunk #{chunk.chunk_id} of run {chunk.run_id} is no longer "
                             "in the ledger: the ledger's purge took its run."]


def test_the_state_filter_puts_dead_first_and_lists_only_that_state(admin_client):
    dead = EventFactory(dead=True)
    EventFactory()

    response = admin_client.get(EVENTS + "?state=dead")

    assert listed(response) == [dead.pk]
    choices = [c["display"] for c in response.context["cl"].filter_specs[0].choices(
        response.context["cl"])]
    assert choices == ["All", "Dead", "Pending", "Delivered", "Discarded"]


def test_the_name_filter_offers_the_names_in_the_outbox(admin_client):
    offer = EventFactory(name="mail.offer")
    EventFactory()

    response = admin_client.get(EVENTS + "?name=mail.offer")

    assert listed(response) == [offer.pk]
    choices = [c["display"] for c in response.context["cl"].filter_specs[1].choices(
        response.context["cl"])]
    assert choices == ["All", "lease.expired", "mail.offer"]


def test_search_finds_an_exact_key_through_the_name_and_key_index(admin_client):
    wanted = EventFactory(key="lease:12")
    EventFactory(key="lease:120")
    EventFactory(name="mail.offer", key="lease:12")

    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(EVENTS, {"q": " lease:12 "})

    assert set(listed(response)) == {wanted.pk, wanted.pk + 2}
    shown = [q["sql"] for q in queries if 'FROM "cleanup_event"' in q["sql"]
             and "ORDER BY" in q["sql"]][-1]
    # Equality on both columns of the unique constraint: never UPPER(), never '%...%'.
    assert "\"cleanup_event\".\"key\" = 'lease:12'" in shown
    assert "\"cleanup_event\".\"name\" IN ('lease.expired', 'mail.offer')" in shown
    assert "UPPER" not in shown and "LIKE" not in shown


def test_search_finds_keys_by_their_start_and_an_event_by_its_dedup_id(admin_client):
    first, second = EventFactory(key="lease:120"), EventFactory(key="lease:121")
    EventFactory(key="lease:2")
    offer = EventFactory(name="mail.offer", key="lease:120")

    by_prefix = admin_client.get(EVENTS, {"q": "lease:12"})
    by_dedup_id = admin_client.get(EVENTS, {"q": offer.dedup_id})
    by_both = admin_client.get(EVENTS, {"q": "lease:12", "name": "mail.offer"})

    assert listed(by_prefix) == [offer.pk, second.pk, first.pk]
    assert listed(by_dedup_id) == [offer.pk]
    assert listed(by_both) == [offer.pk]
    assert listed(admin_client.get(EVENTS, {"q": "%"})) == []  # no wildcard


def test_the_list_counts_no_further_than_its_cap(admin_client, monkeypatch):
    monkeypatch.setattr("cleanup.console.events.LIST_COUNT_CAP", 3)
    EventFactory.create_batch(5)

    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get(EVENTS).content.decode()

    counts = [q["sql"] for q in queries if "COUNT(" in q["sql"]]
    assert counts == ['SELECT COUNT(*) FROM (SELECT "cleanup_event"."id" AS "pk" FROM '
                      '"cleanup_event" LIMIT 4) subquery']
    assert re.search(r"3\+ events\s*</p>", page)
    assert "Select all 3+ events" in page


# An event's page


def test_a_dead_events_page_shows_its_failure_first_then_payload_and_dedup_id(
        admin_client, settings):
    dead = dead_by_its_handler(settings)

    page = page_of(admin_client, dead)

    assert page.index("Failure") < page.index("Payload")
    assert f"ValueError: mail server refused {HOSTILE}" not in page  # escaped, never run
    assert "ValueError: mail server refused &lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" \
        in page
    assert '<pre class="traceback">Traceback (most recent call last):' in page
    # Pretty JSON, escaped: the payload's own <script> is text.
    assert '<pre class="payload">{\n  &quot;' in page
    assert '\n  &quot;note&quot;: &quot;&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;' in page
    assert "<script>alert" not in page
    assert "<code>mail.offer/lease:666</code>" in page
    assert "next try" not in page.lower()  # dead: never tried again by itself


def test_a_pending_event_says_when_it_is_tried_next(admin_client):
    head = EventFactory(state=Event.State.PENDING, delivered_at=None, attempts=1,
                        available_at=timezone.now() + timedelta(minutes=3))
    behind = EventFactory(state=Event.State.PENDING, delivered_at=None)
    alone = EventFactory(state=Event.State.PENDING, delivered_at=None, ordering_key="")

    assert re.search(r"not before \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(in [23] min\)",
                     page_of(admin_client, head))
    waits = page_of(admin_client, behind)
    assert "due now: the publisher&#x27;s next run takes it; and only once <a href=\"" \
        f"{reverse('admin:cleanup_event_change', args=[head.pk])}\">event {head.pk}</a>" \
        in waits
    assert "due now: the publisher&#x27;s next run takes it</div>" in page_of(admin_client,
                                                                               alone)


def test_a_call_that_has_not_returned_is_shown_with_when_it_counts_as_failed(admin_client):
    started = timezone.now() - timedelta(seconds=30)
    event = EventFactory(state=Event.State.PENDING, delivered_at=None, call_started_at=started,
                         available_at=started + timedelta(seconds=5))
    page = page_of(admin_client, event)
    assert re.search(r"began \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \([\d.]+ s ago\) and has not "
                     r"returned: running now, or its publisher died in it", page), page
    assert "handler call" not in page_of(admin_client, EventFactory(
        state=Event.State.PENDING, delivered_at=None))


def test_a_discarded_events_page_shows_why_it_was_discarded(admin_client):
    discarded = EventFactory(dead=True, state=Event.State.DISCARDED,
                             reason=f"the learner left {HOSTILE}")

    page = page_of(admin_client, discarded)

    assert "the learner left &lt;script&gt;" in page
    assert "ValueError: mail server refused" in page  # what it died of, still there


def test_an_event_with_a_state_written_by_hand_shows_as_unknown(admin_client):
    event = EventFactory()
    Event.objects.filter(pk=event.pk).update(state="lost")

    page = admin_client.get(EVENTS).content.decode()

    assert ('<span class="state-badge state-unknown" title="a state the code does not '
            'know">unknown: lost</span>') in page


def test_every_event_state_has_a_badge_with_a_colour_in_the_stylesheet():
    from cleanup.console.events import EVENT_BADGES
    from tests.conftest import ROOT

    css = (ROOT / "cleanup" / "static" / "cleanup" / "console.css").read_text()
    assert set(Event.State.values) <= set(EVENT_BADGES)
    missing = {css_state for css_state, _ in EVENT_BADGES.values()
               if f".state-{css_state} " not in css and f".state-{css_state}," not in css}
    assert missing == set()


# Actions


def test_requeue_confirms_then_requeues_only_the_dead_and_its_replay_changes_nothing(
        admin_client):
    dead, delivered = EventFactory(dead=True), EventFactory()
    selected = [dead.pk, delivered.pk]

    confirm = action(admin_client, "requeue_events", selected)
    assert "Requeue events" in confirm.content.decode()
    assert Event.objects.get(pk=dead.pk).state == Event.State.DEAD

    done = action(admin_client, "requeue_events", selected, post="yes")
    again = action(admin_client, "requeue_events", selected, post="yes")

    assert texts(done) == ["1 event requeued.", "1 event was not dead and was left alone."]
    assert texts(again) == ["0 events requeued.",
                            "2 events were not dead and were left alone."]
    dead.refresh_from_db()
    assert (dead.state, dead.attempts) == (Event.State.PENDING, 10)
    assert Event.objects.get(pk=delivered.pk).state == Event.State.DELIVERED
    entry = LogEntry.objects.get()
    assert (entry.object_id, entry.change_message) == (str(dead.pk), "Requeued")


def test_discard_refuses_an_empty_reason_then_discards_once(admin_client):
    dead, pending = EventFactory(dead=True), EventFactory(state=Event.State.PENDING)
    selected = [dead.pk, pending.pk]

    assert "Discard events" in action(admin_client, "discard_events",
                                      selected).content.decode()
    blank = action(admin_client, "discard_events", selected, post="yes", reason="  ")
    assert "A reason is required to discard events: nothing was discarded." \
        in blank.content.decode()
    assert Event.objects.get(pk=dead.pk).state == Event.State.DEAD

    done = action(admin_client, "discard_events", selected, post="yes",
                  reason="the learner left the course")
    again = action(admin_client, "discard_events", selected, post="yes", reason="again")

    assert texts(done) == ["1 event discarded.", "1 event was not dead and was left alone."]
    assert texts(again) == ["0 events discarded.",
                            "2 events were not dead and were left alone."]
    dead.refresh_from_db()
    assert (dead.state, dead.reason) == (Event.State.DISCARDED, "the learner left the course")
    assert Event.objects.get(pk=pending.pk).state == Event.State.PENDING


def test_a_dead_events_page_offers_its_actions_and_comes_back_to_it(admin_client):
    dead, delivered = EventFactory(dead=True), EventFactory()
    url = reverse("admin:cleanup_event_change", args=[dead.pk])

    page = page_of(admin_client, dead)
    assert 'id="requeue-event"' in page and 'id="discard-event"' in page
    assert 'id="requeue-event"' not in page_of(admin_client, delivered)

    done = admin_client.post(EVENTS, {"action": "requeue_events", "_selected_action": dead.pk,
                                      "next": url, "post": "yes"})

    assert done.status_code == 302 and done["Location"] == url
    assert Event.objects.get(pk=dead.pk).state == Event.State.PENDING


# Permissions


def test_a_viewer_reads_the_events_and_is_offered_no_action(client):
    staff(client, "view_event")
    dead = EventFactory(dead=True)

    listing = client.get(EVENTS)

    assert listing.status_code == 200 and listing.context["action_form"] is None
    assert 'id="requeue-event"' not in page_of(client, dead)
    forged = client.post(EVENTS, {"action": "requeue_events", "_selected_action": dead.pk,
                                  "post": "yes"})
    assert forged.status_code == 403
    assert Event.objects.get(pk=dead.pk).state == Event.State.DEAD


def test_each_action_is_offered_with_its_own_permission(client):
    staff(client, "view_event", "discard")
    dead = EventFactory(dead=True)

    choices = [c[0] for c in client.get(EVENTS).context["action_form"].fields["action"].choices]

    assert choices == ["", "discard_events"]
    page = page_of(client, dead)
    assert 'id="discard-event"' in page and 'id="requeue-event"' not in page


def test_events_are_hidden_without_the_view_permission(client):
    dead = EventFactory(dead=True)
    assert client.get(EVENTS)["Location"].startswith("/admin/login/")
    staff(client, "view_run", "view_chunk")  # the support role of runs and chunks
    assert client.get(EVENTS).status_code == 403
    assert client.get(reverse("admin:cleanup_event_change", args=[dead.pk])).status_code == 403
    assert client.get(reverse("admin:cleanup_event_chunk", args=[dead.pk])).status_code == 403


def test_events_cannot_be_added_edited_or_deleted(admin_client):
    event = EventFactory(dead=True)
    url = reverse("admin:cleanup_event_change", args=[event.pk])

    assert admin_client.get(reverse("admin:cleanup_event_add")).status_code == 403
    assert 'name="_save"' not in page_of(admin_client, event)
    assert admin_client.post(url, {"state": "delivered"}).status_code == 403
    delete = reverse("admin:cleanup_event_delete", args=[event.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert Event.objects.get(pk=event.pk).state == Event.State.DEAD
