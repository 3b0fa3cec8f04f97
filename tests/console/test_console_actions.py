"""The console's actions act on exactly what the operator selected, under every list
filter, through the admin's own two-step POST flow."""

from __future__ import annotations

import re

import pytest
from django.db import OperationalError
from django.urls import reverse
from django_q.models import OrmQ

from cleanup import faults
from cleanup.engine.dispatch import dispatch
from cleanup.engine.operations import ALL_CHUNKS
from cleanup.engine.replay import replay
from cleanup.engine.worker import apply_chunk
from cleanup.exceptions import CleanupError
from cleanup.models import Chunk, Run
from tests.engine_app.factories import LeaseFactory

pytestmark = pytest.mark.django_db

CHUNKS = reverse("admin:cleanup_chunk_changelist")


@pytest.fixture
def two_runs(account, chunk_size, settings):
    """Two runs of 6 and 10 one-row chunks (the second also covers the first's rows),
    every chunk planned at dispatch; half of the first run's chunks dead-lettered."""
    chunk_size("expire-leases", 1)
    settings.CLEANUP_WINDOW = 100
    LeaseFactory.create_batch(6, account=account, expired=True)
    first = dispatch("expire-leases").run
    LeaseFactory.create_batch(4, account=account, expired=True)
    second = dispatch("expire-leases", key="second").run
    assert (first.chunks.count(), second.chunks.count()) == (6, 10)
    Chunk.objects.filter(run=first, chunk_id__lte=3).update(
        state=Chunk.State.DEAD_LETTERED, failure_class=Chunk.FailureClass.POISON)
    OrmQ.objects.all().delete()
    return first, second


def replay_selected(client, url: str, pks: list[int]):
    """The operator's two clicks: the action, then "Yes, I'm sure" on its page."""
    data = {"action": "replay_chunks", "_selected_action": [str(pk) for pk in pks]}
    confirmation = client.post(url, data)
    assert "Replay chunks" in confirmation.content.decode()
    assert OrmQ.objects.count() == 0
    return client.post(url, {**data, "post": "yes"}, follow=True)


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


@pytest.mark.parametrize("list_filter", ["", "?state=dead_lettered", "?run={first}",
                                         "?failure_class=poison"])
def test_replay_selected_chunks_sends_exactly_the_selection_under_each_filter(
        admin_client, two_runs, list_filter):
    first, _ = two_runs
    selected = list(first.chunks.filter(chunk_id__in=[2, 3]).values_list("pk", flat=True))

    response = replay_selected(admin_client, CHUNKS + list_filter.format(first=first.pk),
                               selected)

    assert OrmQ.objects.count() == 2
    assert messages_of(response) == ["2 chunks re-sent."]
    # The other dead letter of the run stays where it was.
    assert first.chunks.get(chunk_id=1).state == Chunk.State.DEAD_LETTERED
    assert set(first.chunks.filter(chunk_id__in=[2, 3]).values_list("state", flat=True)) == {
        Chunk.State.ENQUEUED}


def test_replay_selected_chunks_across_two_runs_sends_each_once(admin_client, two_runs):
    first, second = two_runs
    selected = [first.chunks.get(chunk_id=5).pk, *second.chunks.filter(
        chunk_id__in=[1, 4]).values_list("pk", flat=True)]

    response = replay_selected(admin_client, CHUNKS, selected)

    assert sorted((m["run_id"], m["chunk_id"]) for m in queued_messages()) == sorted(
        [(str(first.pk), 5), (str(second.pk), 1), (str(second.pk), 4)])
    assert messages_of(response) == ["3 chunks re-sent."]


def queued_messages() -> list[dict]:
    return [task.task["args"][0] for task in OrmQ.objects.all()]


def test_an_empty_chunk_selection_is_refused_and_sends_nothing(two_runs):
    first, _ = two_runs

    for empty in ([], (), None):
        with pytest.raises(CleanupError, match="no chunk of run .* selected"):
            replay(first.pk, chunk_ids=empty)

    assert OrmQ.objects.count() == 0
    assert first.chunks.filter(state=Chunk.State.DEAD_LETTERED).count() == 3


def test_every_chunk_is_replayed_only_when_asked_for_explicitly(two_runs):
    first, _ = two_runs

    result = replay(first.pk, chunk_ids=ALL_CHUNKS)

    assert result.resent == OrmQ.objects.count() == 6
    first.refresh_from_db()
    assert first.state == Run.State.RUNNING


def test_a_poison_dead_letter_keeps_the_lock_timeout_that_caused_it(admin_client, settings):
    settings.CLEANUP_TRANSIENT_RETRIES = 1
    settings.CLEANUP_TRANSIENT_BACKOFF = 0
    settings.CLEANUP_MAX_UNFINISHED_DELIVERIES = 2
    LeaseFactory(expired=True)
    chunk = dispatch("expire-leases").run.chunks.get()

    def lock_timeout():
        # What a lock no skipping of locked rows gets past (the table's) raises.
        raise OperationalError("canceling statement due to lock timeout")

    with faults.injected(faults.BEFORE_CHUNK_LOCK, lock_timeout), pytest.raises(
            OperationalError, match="lock timeout"):
        apply_chunk(chunk.message)  # the lock outlasted the in-task retries: redelivery
    # Two more deliveries whose workers were killed mid-chunk, then the next one.
    Chunk.objects.filter(pk=chunk.pk).update(deliveries=3)
    assert apply_chunk(chunk.message) == "dead_lettered"

    chunk.refresh_from_db()
    lock_timeout = "OperationalError: canceling statement due to lock timeout"
    assert (chunk.failure_class, chunk.cause) == (Chunk.FailureClass.POISON, lock_timeout)
    assert chunk.verdict.startswith("3 deliveries started without completing")
    assert "Traceback" in chunk.last_error and "CONTEXT" not in chunk.cause
    dead_letters = admin_client.get(CHUNKS + "?state=dead_lettered").content.decode()
    assert lock_timeout in dead_letters
    page = admin_client.get(reverse("admin:cleanup_chunk_change", args=[chunk.pk]))
    assert f"{lock_timeout}; 3 deliveries started without completing" in page.content.decode()


# Finding a run by the id the console shows


def test_a_short_id_or_a_full_id_finds_the_run_and_not_only_its_replay(admin_client,
                                                                       two_runs):
    first, second = two_runs
    replay_of_first = dispatch("expire-leases", key=f"replay:{first.pk}:again").run
    runs = reverse("admin:cleanup_run_changelist")

    for term in (str(first.pk)[:8], str(first.pk), str(first.pk)[:8].upper()):
        page = admin_client.get(runs, {"q": term, "work": "all"})
        assert list(page.context["cl"].result_list) == [first], term
    # Other text still searches the dispatch keys.
    page = admin_client.get(runs, {"q": "replay:", "work": "all"})
    assert list(page.context["cl"].result_list) == [replay_of_first]
    # On the chunk list, a run's id lists its chunks.
    page = admin_client.get(CHUNKS, {"q": str(second.pk)[:8]})
    assert {c.run_id for c in page.context["cl"].result_list} == {second.pk}


def test_a_short_id_in_a_run_url_redirects_to_the_run(admin_client, two_runs):
    first, _ = two_runs
    short = str(first.pk)[:8]

    response = admin_client.get(f"/admin/cleanup/run/{short}/change/")

    assert response.status_code == 302
    assert response["Location"] == reverse("admin:cleanup_run_change", args=[first.pk])
    assert admin_client.get("/admin/cleanup/run/0000zzzz/change/").status_code == 302
    assert admin_client.get("/admin/cleanup/run/0000zzzz/change/", follow=True).context[
        "messages"]  # Django's own "doesn't exist" message for what names no run


# The run page


def test_the_run_page_filters_its_chunks_by_state_and_pages_600_of_them(
        admin_client, account, chunk_size, settings):
    chunk_size("expire-leases", 1)
    settings.CLEANUP_WINDOW = 1000
    LeaseFactory.create_batch(600, account=account, expired=True)
    run = dispatch("expire-leases").run
    Chunk.objects.filter(run=run, chunk_id__in=[7, 300, 599]).update(
        state=Chunk.State.DEAD_LETTERED, cause="OperationalError: lock timeout")
    url = reverse("admin:cleanup_run_change", args=[run.pk])

    page = admin_client.get(url, {"chunks": 6}).content.decode()
    assert "Chunks (600)" in page
    assert "chunks 251–300 of 600, page 6 of 12" in page
    # Pages near this one, the first and the last: never a list of twelve links.
    assert ">1</a>" in page and ">12</a>" in page and ">9</a>" not in page and "…" in page
    assert 'class="state-badge state-enqueued"' in page
    assert "Dead-lettered (3)" in page and "Enqueued (597)" in page

    dead = admin_client.get(url, {"chunk_state": "dead_lettered"}).content.decode()
    assert [int(n) for n in re.findall(r">#(\d+)</a>", dead)] == [7, 300, 599]
    assert "Requeue this run&#x27;s 3 dead letters…" in dead
    assert admin_client.get(url, {"chunk_state": "bogus"}).status_code == 200


# Dead-letter triage


@pytest.fixture
def dead_letters_of_two_causes(two_runs):
    first, second = two_runs
    Chunk.objects.filter(run=first, chunk_id__lte=3).update(
        cause="OperationalError: canceling statement due to lock timeout")
    Chunk.objects.filter(run=second, chunk_id__in=[1, 2]).update(
        state=Chunk.State.DEAD_LETTERED, failure_class=Chunk.FailureClass.ERROR,
        cause='IntegrityError: insert or update on table "x" violates foreign key')
    return first, second


def test_dead_letters_are_grouped_by_cause_with_counts(admin_client,
                                                       dead_letters_of_two_causes):
    page = admin_client.get(reverse("admin:cleanup_chunk_dead_letters"))

    groups = [(g.failure_class, g.cause, g.count, g.runs) for g in page.context["groups"]]
    assert groups == [
        ("poison", "OperationalError: canceling statement due to lock timeout", 3, 1),
        ("error", 'IntegrityError: insert or update on table "x" violates foreign key', 2, 1),
    ]
    assert "Requeue 3…" in page.content.decode()


def test_requeue_a_whole_group_confirms_then_requeues_only_that_group(
        admin_client, dead_letters_of_two_causes):
    first, second = dead_letters_of_two_causes
    triage_url = reverse("admin:cleanup_chunk_dead_letters")
    group = admin_client.get(triage_url).context["groups"][0]
    url = (CHUNKS + "?state=dead_lettered&failure_class=poison&cause="
           + "OperationalError%3A%20canceling%20statement%20due%20to%20lock%20timeout")
    data = {"action": "requeue_chunks", "select_across": "1", "index": "0",
            "_selected_action": str(group.example_pk), "next": triage_url}

    confirmation = admin_client.post(url, data)
    assert confirmation.context["count"] == 3 and OrmQ.objects.count() == 0
    done = admin_client.post(url, {**yes_on(confirmation), "next": triage_url})

    assert done.status_code == 302 and done["Location"] == triage_url
    assert OrmQ.objects.count() == 3
    assert set(first.chunks.filter(chunk_id__lte=3).values_list("state", flat=True)) == {
        Chunk.State.ENQUEUED}
    assert second.chunks.filter(state=Chunk.State.DEAD_LETTERED).count() == 2


def test_an_action_from_a_chunk_page_returns_to_that_page(admin_client, two_runs):
    first, _ = two_runs
    chunk = first.chunks.get(chunk_id=1)
    page = reverse("admin:cleanup_chunk_change", args=[chunk.pk])
    data = {"action": "requeue_chunks", "_selected_action": [str(chunk.pk)], "next": page}

    confirmation = admin_client.post(CHUNKS, data)
    assert confirmation.context["back"] == page
    done = admin_client.post(CHUNKS, {**data, "post": "yes"})

    assert done["Location"] == page
    chunk.refresh_from_db()
    assert chunk.state == Chunk.State.ENQUEUED
    # A next that leaves the site is ignored: back to the list acted on.
    elsewhere = admin_client.post(CHUNKS, {**data, "post": "yes", "next": "https://x.test/"})
    assert elsewhere["Location"] == CHUNKS


def test_a_group_counted_for_one_policy_acts_on_that_policy_only(
        admin_client, dead_letters_of_two_causes):
    first, _ = dead_letters_of_two_causes
    cause = "OperationalError: canceling statement due to lock timeout"
    other = dispatch("purge-lease-logs", key="other-policy").run  # no log: no chunk
    Chunk.objects.create(run=other, chunk_id=1, message={}, state=Chunk.State.DEAD_LETTERED,
                         failure_class=Chunk.FailureClass.POISON, cause=cause)
    page = admin_client.get(reverse("admin:cleanup_chunk_dead_letters"),
                            {"policy": "expire-leases"})
    group = page.context["groups"][0]
    assert (group.cause, group.count) == (cause, 3)

    confirmation = admin_client.post(group.chunks_url, {
        "action": "requeue_chunks", "select_across": "1", "index": "0",
        "_selected_action": str(group.example_pk)})

    assert confirmation.context["count"] == 3
    assert {c.run_id for c in confirmation.context["objects"]} == {first.pk}


def yes_on(confirmation) -> dict:
    """The form "Yes, I'm sure" posts, as the confirmation page rendered it."""
    fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">',
                             confirmation.content.decode()))
    fields.pop("csrfmiddlewaretoken", None)
    return fields


def test_a_group_of_thousands_is_requeued_through_a_small_confirmation(admin_client,
                                                                       two_runs):
    first, _ = two_runs
    cause = "OperationalError: canceling statement due to lock timeout"
    Chunk.objects.bulk_create(
        Chunk(run=first, chunk_id=100 + n, message=first.chunks.get(chunk_id=1).message,
              state=Chunk.State.DEAD_LETTERED, failure_class=Chunk.FailureClass.POISON,
              cause=cause) for n in range(1500))
    group = admin_client.get(reverse("admin:cleanup_chunk_dead_letters")).context["groups"][0]
    data = {"action": "requeue_chunks", "select_across": "1", "index": "0",
            "_selected_action": str(group.example_pk)}

    confirmation = admin_client.post(group.chunks_url, data)
    assert confirmation.context["count"] == group.count == 1500
    form = yes_on(confirmation)
    assert len(form) < 10  # the filter itself, not 1,500 ids past Django's field limit
    done = admin_client.post(group.chunks_url, form, follow=True)

    assert messages_of(done) == ["1500 chunks requeued."]
    assert first.chunks.filter(cause=cause, state=Chunk.State.ENQUEUED).count() == 1500


def test_a_group_that_changed_after_its_confirmation_is_asked_again(admin_client,
                                                                    dead_letters_of_two_causes):
    first, second = dead_letters_of_two_causes
    group = admin_client.get(reverse("admin:cleanup_chunk_dead_letters")).context["groups"][0]
    confirmation = admin_client.post(group.chunks_url, {
        "action": "requeue_chunks", "select_across": "1", "index": "0",
        "_selected_action": str(group.example_pk)})
    # Another chunk dies of the same cause meanwhile.
    second.chunks.filter(chunk_id=9).update(state=Chunk.State.DEAD_LETTERED,
                                            failure_class="poison", cause=group.cause)

    again = admin_client.post(group.chunks_url, yes_on(confirmation))

    assert again.context["count"] == 4
    assert "changed since the confirmation was shown" in " ".join(messages_of(again))
    assert OrmQ.objects.count() == 0
    assert Chunk.objects.filter(state=Chunk.State.DEAD_LETTERED).count() == 6
