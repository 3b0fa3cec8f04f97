"""A range's next chunk planned from the density of the run's latest chunks, without
counting it (docs/design.md, *A chunk in three calls*); counted again where a chunk
found too few rows, so a stretch where nothing is eligible is crossed in one probe."""

from __future__ import annotations

import threading

import psycopg
import pytest
from django.utils import timezone

from cleanup.engine import sizing
from cleanup.engine.dispatch import dispatch
from cleanup.engine.worker import apply_chunk
from cleanup.models import Chunk
from tests.conftest import chunks_of, database_url
from tests.engine.test_window import drain
from tests.engine_app.factories import LeaseFactory
from tests.engine_app.models import Lease

POLICY = "expire-leases"


def leases(account, count: int, *, expired: bool) -> None:
    Lease.objects.bulk_create(LeaseFactory.build_batch(count, account=account,
                                                       expired=expired))


def covered(run) -> list[tuple[int, int]]:
    return [(chunk.message["start_id"], chunk.message["end_id"]) for chunk in chunks_of(run)]


def test_a_dense_run_plans_its_later_chunks_from_its_density(account, chunk_size):
    chunk_size(POLICY, 100)
    leases(account, 1_000, expired=True)
    run = dispatch(POLICY, scheme="range").run

    drain()

    run.refresh_from_db()
    chunks = chunks_of(run)
    assert not Lease.objects.exists()
    assert run.state == run.State.COMPLETED
    # The first window was counted; each chunk after it was planned from the density.
    assert [chunk.rows_estimated for chunk in chunks] == [False] * 4 + [True] * (
        len(chunks) - 4)
    assert all(chunk.planned_rows == 100 for chunk in chunks[:-1])
    # The ranges follow one another, without a gap or an overlap, to the span's end.
    ranges = covered(run)
    assert all(end == following for (_, end), (following, _) in zip(ranges, ranges[1:],
                                                                     strict=False))
    assert ranges[-1][1] == run.span_end
    # An estimate says nothing of what was skipped.
    assert sum(chunk.items_skipped for chunk in chunks) == 0


def test_a_chunk_that_finds_too_few_rows_has_its_successor_counted(account, chunk_size):
    """A stretch of renewed holds in the middle: the estimated chunk that lands on it
    finds nothing; the next is counted, from the first eligible row past the stretch."""
    chunk_size(POLICY, 100)
    leases(account, 800, expired=True)
    leases(account, 3_000, expired=False)  # never eligible
    leases(account, 800, expired=True)
    first_id = Lease.objects.order_by("pk").values_list("pk", flat=True).first()
    run = dispatch(POLICY, scheme="range").run

    drain()

    chunks = chunks_of(run)
    assert Lease.objects.filter(expires_at__lte=timezone.now()).count() == 0
    assert Lease.objects.count() == 3_000
    empty = [chunk for chunk in chunks if chunk.rows_deleted == 0]
    assert empty and all(chunk.rows_estimated for chunk in empty)
    # The chunks in flight when the first of them committed were planned already (the
    # window, 4); those their commits planned were counted, the first from the first
    # eligible row past the stretch, until a chunk found its rows again.
    assert len(empty) <= 4
    counted = [chunk for chunk in chunks[4:] if not chunk.rows_estimated]
    assert counted and counted[0].chunk_id > empty[0].chunk_id
    assert counted[0].message["start_id"] == first_id + 3_800
    assert chunks[-1].rows_estimated  # ... and the density was trusted again
    assert len(chunks) <= 16 + 4  # the stretch cost a window of chunks, not thirty


@pytest.mark.parametrize("newest, expected", [
    ({"planned_rows": 100, "changed": 100}, 2.0),
    ({"planned_rows": 100, "changed": 49}, None),  # found under half: counted again
    ({"planned_rows": 100, "changed": 0}, None),
])
def test_the_density_is_trusted_while_the_newest_chunk_found_what_it_planned(newest,
                                                                              expected):
    older = {"planned_rows": 100, "changed": 100, "message__start_id": 0,
             "message__end_id": 200}
    latest = [{**newest, "message__start_id": 200, "message__end_id": 400}, older, older]
    assert sizing.density(latest) == expected
    assert sizing.density([]) is None
    # An items chunk has no span.
    assert sizing.density([{**older, "message__start_id": None,
                            "message__end_id": None}]) is None


def test_an_estimated_chunks_pace_is_read_from_the_rows_it_changed():
    chunk = {"planned_rows": 1_000, "changed": 200, "duration_ms": 10, "cpu_wait_ms": None,
             "rows_estimated": True}
    assert sizing._pace(chunk) == 20
    assert sizing._pace({**chunk, "rows_estimated": False}) == 100


def test_a_chunks_page_says_its_planned_rows_were_estimated(admin_client, account,
                                                           chunk_size):
    chunk_size(POLICY, 100)
    leases(account, 600, expired=True)
    run = dispatch(POLICY, scheme="range").run
    drain()
    estimated = Chunk.objects.filter(run=run, rows_estimated=True).first()

    page = admin_client.get(f"/admin/cleanup/chunk/{estimated.pk}/change/")

    assert "about 100 (estimated)" in page.content.decode()
    counted = Chunk.objects.filter(run=run, rows_estimated=False).first()
    page = admin_client.get(f"/admin/cleanup/chunk/{counted.pk}/change/")
    assert "(estimated)" not in page.content.decode()


@pytest.mark.django_db(transaction=True)
def test_a_chunks_top_up_waits_for_the_planning_lock_as_the_transaction_does(
        account, chunk_size, settings):
    """The chunk's statement waits for learners' rows 50 ms at most; its top-up waits for
    another chunk's planning as long as the transaction's lock bound allows: two chunks
    ending at once are no failure, and the window is topped up (issue 47, item 6)."""
    settings.CLEANUP_ROW_LOCK_WAIT_MS = 50
    settings.CLEANUP_WINDOW = 1
    chunk_size(POLICY, 1)
    leases(account, 3, expired=True)
    run = dispatch(POLICY, scheme="range").run
    (first,) = chunks_of(run)

    with psycopg.connect(database_url()) as other:
        other.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                      [f"cleanup:{POLICY}"])  # another chunk's end, planning
        released = threading.Timer(0.3, other.commit)
        released.start()
        try:
            apply_chunk(first.message)
        finally:
            released.join()

    assert len(chunks_of(run)) == 2  # the next one planned, after the wait
