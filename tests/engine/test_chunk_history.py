"""A chunk's history: every delivery with its time, worker, duration, outcome and
error line, written by the statements that already count it; a run page that says
why it waits; a run's rate over the time it worked, not the time it was stuck."""

from __future__ import annotations

import contextlib
from datetime import timedelta

import pytest
from django.db import OperationalError
from django.urls import reverse
from django.utils import timezone

from cleanup import faults
from cleanup.engine import leases, operations, transitions
from cleanup.engine.dispatch import dispatch
from cleanup.engine.worker import Outcome, apply_chunk
from cleanup.models import Chunk, Run, WorkerHeartbeat
from cleanup.observability import waits

pytestmark = pytest.mark.django_db
LOCK_TIMEOUT = "OperationalError: canceling statement due to lock timeout"


def lock_timeout():
    raise OperationalError("canceling statement due to lock timeout")


def history(chunk: Chunk) -> list[dict]:
    return Chunk.objects.get(pk=chunk.pk).history


def test_a_committed_delivery_is_recorded_with_its_worker_rows_and_end(expired_leases):
    chunk = dispatch("expire-leases").run.chunks.get()
    assert apply_chunk(chunk.message) == Outcome.DELETED

    [entry] = history(chunk)
    assert entry["n"] == 1
    assert entry["worker"] == leases.this_process()
    assert entry["outcome"] == "committed"
    assert entry["rows"] == len(expired_leases)
    assert entry["ended_at"] >= entry["at"]
    assert "error" not in entry and "retries" not in entry


def test_a_duplicate_delivery_is_recorded_as_a_noop_beside_the_first(expired_leases):
    chunk = dispatch("expire-leases").run.chunks.get()
    apply_chunk(chunk.message)
    assert apply_chunk(chunk.message) == Outcome.NOOP

    first, second = history(chunk)
    assert (first["n"], first["outcome"]) == (1, "committed")
    assert (second["n"], second["outcome"]) == (2, "no-op: already committed")
    assert "rows" not in second


def test_a_transient_failure_is_recorded_with_its_error_line_then_the_commit(
        settings, expired_leases):
    settings.CLEANUP_TRANSIENT_RETRIES = 1
    settings.CLEANUP_TRANSIENT_BACKOFF = 0
    chunk = dispatch("expire-leases").run.chunks.get()
    with faults.injected(faults.BEFORE_CHUNK_LOCK, lock_timeout), \
            contextlib.suppress(OperationalError):  # the broker would deliver it again
        apply_chunk(chunk.message)
    apply_chunk(chunk.message)

    failed, committed = history(chunk)
    assert failed["outcome"] == "left for redelivery"
    assert failed["error"] == LOCK_TIMEOUT
    assert failed["retries"] == 1  # tried again once inside the delivery
    assert committed["outcome"] == "committed"


def test_a_delivery_whose_worker_died_stays_without_an_outcome(expired_leases):
    chunk = dispatch("expire-leases").run.chunks.get()
    # What a worker killed mid-chunk leaves: its start committed, nothing after.
    transitions.start_delivery(chunk.run_id, chunk.chunk_id, received_at=timezone.now(),
                               worker="host-a:41:ab", lock_ms=5_000)
    apply_chunk(chunk.message)  # the broker's redelivery

    died, redelivered = waits.deliveries(Chunk.objects.get(pk=chunk.pk))[::-1]
    assert (died.number, died.worker, died.ended, died.seconds) == (1, "host-a:41", False,
                                                                   None)
    assert (redelivered.number, redelivered.outcome) == (2, "committed")


def test_two_deliveries_at_once_each_end_their_own_entry(expired_leases):
    chunk = dispatch("expire-leases").run.chunks.get()
    # A task longer than django-q2's retry runs twice at once: the first to end must
    # not write its outcome onto the second's entry.
    _, first = transitions.start_delivery(chunk.run_id, chunk.chunk_id,
                                          received_at=timezone.now(), worker="a:1:x",
                                          lock_ms=5_000)
    _, second = transitions.start_delivery(chunk.run_id, chunk.chunk_id,
                                           received_at=timezone.now(), worker="b:2:y",
                                           lock_ms=5_000)
    transitions.to_retrying(chunk, error="Traceback (most recent call last):\n  x\n"
                      "OperationalError: server closed the connection", retries=0,
                      delivery=first)

    one, two = history(chunk)
    assert (one["n"], one["outcome"]) == (first, "left for redelivery")
    assert one["error"] == "OperationalError: server closed the connection"
    assert two["n"] == second and "outcome" not in two


def test_a_dead_lettered_delivery_is_recorded_with_its_class_and_cause(
        settings, expired_leases):
    settings.CLEANUP_TRANSIENT_RETRIES = 0
    settings.CLEANUP_MAX_UNFINISHED_DELIVERIES = 2
    chunk = dispatch("expire-leases").run.chunks.get()
    with faults.injected(faults.BEFORE_CHUNK_LOCK, lock_timeout):
        for _ in range(2):
            with contextlib.suppress(OperationalError):
                apply_chunk(chunk.message)
        apply_chunk(chunk.message)

    *_, refused = history(chunk)
    assert refused["outcome"] == "dead-lettered (transient)"
    # Its cause, as the chunk's: the numbers out (the verdict keeps them).
    assert refused["error"].startswith("… deliveries started without completing (limit …)")
    # A delivery of the dead letter is refused at its start and says so.
    apply_chunk(chunk.message)
    assert history(chunk)[-1]["outcome"] == "not applied: the chunk is dead-lettered"


def test_the_history_keeps_the_last_fifty_deliveries(expired_leases):
    chunk = dispatch("expire-leases").run.chunks.get()
    for _ in range(transitions.HISTORY_KEPT + 10):
        transitions.start_delivery(chunk.run_id, chunk.chunk_id, received_at=timezone.now(),
                                   worker="w:1:t", lock_ms=5_000)
    chunk.refresh_from_db()

    assert [entry["n"] for entry in chunk.history] == list(range(11, 61))
    assert waits.not_kept(chunk) == 10


def test_a_history_edited_by_hand_reads_as_unknown_not_an_error(expired_leases,
                                                                  admin_client):
    chunk = dispatch("expire-leases").run.chunks.get()
    Chunk.objects.filter(pk=chunk.pk).update(
        deliveries=3,
        history=[7, {"n": "x", "at": "not a time", "worker": None}, {"n": 3, "rows": -5}])

    found = waits.deliveries(Chunk.objects.get(pk=chunk.pk))
    assert [(d.number, d.began_at, d.worker, d.rows) for d in found] == [
        (3, None, "", 0), (0, None, "", 0)]
    page = admin_client.get(reverse("admin:cleanup_chunk_change", args=[chunk.pk]))
    assert page.status_code == 200


def test_the_chunk_page_shows_each_delivery(settings, expired_leases, admin_client):
    settings.CLEANUP_TRANSIENT_RETRIES = 0
    chunk = dispatch("expire-leases").run.chunks.get()
    with faults.injected(faults.BEFORE_CHUNK_LOCK, lock_timeout), \
            contextlib.suppress(OperationalError):
        apply_chunk(chunk.message)
    apply_chunk(chunk.message)

    page = admin_client.get(reverse("admin:cleanup_chunk_change", args=[chunk.pk]))
    text = page.content.decode()
    assert "Deliveries (2)" in text
    assert LOCK_TIMEOUT in text and "left for redelivery" in text and "committed" in text
    assert leases.this_process().rsplit(":", 1)[0] in text


def test_a_paused_run_says_it_is_halted_and_by_whom(expired_leases):
    run = dispatch("expire-leases").run
    operations.pause_policy("expire-leases", "nightly maintenance", actor="alice")

    [halted, *_] = waits.why_it_waits(run)
    assert halted.startswith("halted: paused ")
    assert "by alice: nightly maintenance" in halted


def test_a_run_with_its_window_full_of_retrying_chunks_says_on_what_and_since_when(
        settings, chunk_size, expired_leases):
    chunk_size("expire-leases", 1)
    settings.CLEANUP_WINDOW = 2
    settings.CLEANUP_TRANSIENT_RETRIES = 0
    run = dispatch("expire-leases").run
    with faults.injected(faults.BEFORE_CHUNK_LOCK, lock_timeout):
        for chunk in run.chunks.all():
            with contextlib.suppress(OperationalError):
                apply_chunk(chunk.message)
    run.refresh_from_db()
    assert not run.planned_all  # more leases than the window holds

    reasons = waits.why_it_waits(run)
    assert any(reason.startswith(f"window full: 2 of 2 chunks in flight retrying on "
                                 f"{LOCK_TIMEOUT} since ") for reason in reasons), reasons
    assert any(reason.startswith("next redelivery at about ") for reason in reasons), reasons


def test_a_queued_run_with_no_worker_says_so(expired_leases):
    run = dispatch("expire-leases").run
    assert waits.why_it_waits(run)[-1].endswith(
        "no worker has ever beaten: start manage.py qcluster")
    WorkerHeartbeat.objects.create(host="h", cluster="c", pid=1,
                                   beat_at=timezone.now() - timedelta(hours=1))
    assert "no worker has beaten since 1.0 h ago" in waits.why_it_waits(run)[-1]


def test_a_finished_run_waits_on_nothing(expired_leases):
    run = dispatch("expire-leases").run
    for chunk in run.chunks.all():
        apply_chunk(chunk.message)
    run.refresh_from_db()
    assert run.state == Run.State.COMPLETED
    assert waits.why_it_waits(run) == []


def test_a_runs_rate_counts_the_time_it_worked_not_the_time_it_was_stuck(
        expired_leases, admin_client):
    run = dispatch("expire-leases").run
    start = timezone.now() - timedelta(hours=1)
    # Two bursts of work, 2 s each, 15 minutes apart (stuck between them), the second
    # of two chunks at once: 4 s of work in all. (began, in seconds; duration in ms)
    spans = [(0, 1000), (1, 1000), (900, 2000), (900.5, 1000)]
    for chunk_id, (at, ms) in enumerate(spans, start=1):
        Chunk.objects.update_or_create(
            run=run, chunk_id=chunk_id,
            defaults={"state": Chunk.State.ACKNOWLEDGED, "duration_ms": ms,
                      "rows_deleted": 1000, "message": {},
                      "committed_at": start + timedelta(seconds=at, milliseconds=ms)})
    Chunk.objects.filter(run=run).exclude(chunk_id__in=range(1, 5)).delete()

    assert waits.working_seconds(run) == pytest.approx(4.0, abs=0.01)
    page = admin_client.get(reverse("admin:cleanup_run_change", args=[run.pk]))
    assert "1,000 rows/s" in page.content.decode()
    assert "over 4.0 s of work" in page.content.decode()


def test_chunks_retrying_with_no_recorded_delivery_still_say_why(settings, chunk_size,
                                                                 expired_leases, admin_client):
    chunk_size("expire-leases", 1)
    settings.CLEANUP_WINDOW = 2
    run = dispatch("expire-leases").run
    # Retried before deliveries were recorded (an upgrade): no history to date them by.
    run.chunks.update(state=Chunk.State.RETRYING, cause=LOCK_TIMEOUT, history=[])

    assert f"window full: 2 of 2 chunks in flight retrying on {LOCK_TIMEOUT}" in \
        waits.why_it_waits(run)
    page = admin_client.get(reverse("admin:cleanup_run_change", args=[run.pk]))
    assert page.status_code == 200


def test_a_paused_run_is_not_said_to_be_planning_its_next_chunks(expired_leases,
                                                                  chunk_size, settings):
    """cleanup_status lists the pause itself (halted=False): the run waits on it, and
    is not "planning its next chunks" beside it."""
    settings.CLEANUP_WINDOW = 2
    chunk_size("expire-leases", 1)
    run = dispatch("expire-leases", scheme="range").run
    operations.pause_policy("expire-leases", "maintenance", actor="alice")
    for chunk in run.chunks.all():
        apply_chunk(chunk.message)  # their ends plan nothing: paused
    run.refresh_from_db()
    assert run.state == Run.State.RUNNING and not run.planned_all
    assert not run.chunks.filter(state__in=Chunk.UNFINISHED).exists()

    assert waits.why_it_waits(run, halted=False) == []
    (halted,) = waits.why_it_waits(run)
    assert halted.startswith("halted: paused ") and "by alice: maintenance" in halted
