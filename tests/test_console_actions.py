"""The console's actions act on exactly what the operator selected, under every list
filter, through the admin's own two-step POST flow."""

from __future__ import annotations

import threading

import pytest
from django.db import OperationalError
from django.urls import reverse
from django_q.models import OrmQ

from cleanup.dispatch import dispatch
from cleanup.exceptions import CleanupError
from cleanup.models import Chunk, Run
from cleanup.operations import ALL_CHUNKS
from cleanup.replay import replay
from cleanup.worker import apply_chunk
from reservations.models import SeatHold
from tests.factories import SeatHoldFactory

pytestmark = pytest.mark.django_db

CHUNKS = reverse("admin:cleanup_chunk_changelist")


@pytest.fixture
def two_runs(section, chunk_size, settings):
    """Two runs of 6 and 10 one-row chunks (the second also covers the first's rows),
    every chunk planned at dispatch; half of the first run's chunks dead-lettered."""
    chunk_size("expire-holds", 1)
    settings.CLEANUP_WINDOW = 100
    SeatHoldFactory.create_batch(6, section=section, expired=True)
    first = dispatch("expire-holds").run
    SeatHoldFactory.create_batch(4, section=section, expired=True)
    second = dispatch("expire-holds", key="second").run
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


@pytest.mark.django_db(transaction=True)  # a second real connection holds the row lock
def test_a_poison_dead_letter_keeps_the_lock_timeout_that_caused_it(admin_client, settings):
    from tests.test_concurrency import Worker, hold_lock_while

    settings.CLEANUP_LOCK_TIMEOUT_MS = 50
    settings.CLEANUP_TRANSIENT_RETRIES = 1
    settings.CLEANUP_MAX_UNFINISHED_DELIVERIES = 2
    hold = SeatHoldFactory(expired=True)
    chunk = dispatch("expire-holds").run.chunks.get()
    locked, release = threading.Event(), threading.Event()
    blocker = Worker(hold_lock_while, hold.pk, locked, release,
                     lambda pk: SeatHold.objects.select_for_update().get(pk=pk))
    blocker.start()
    assert locked.wait(10)
    with pytest.raises(OperationalError, match="lock timeout"):
        apply_chunk(chunk.message)  # the lock outlasted the in-task retries: redelivery
    release.set()
    blocker.outcome()
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
