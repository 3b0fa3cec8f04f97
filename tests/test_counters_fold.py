"""Folding the chunks of finished runs into LedgerTotal changes no figure a scrape
reports; a folded chunk that changes again counts with its new values, and one that a
purge deletes keeps its counters and leaves its state's gauge."""

from __future__ import annotations

import threading
from collections import defaultdict
from datetime import timedelta

import psycopg
import pytest
from django.db import connection
from django.db.models import Count
from django.utils import timezone

from cleanup.engine.dispatch import dispatch_in_process
from cleanup.engine.replay import replay
from cleanup.engine.worker import apply_chunk
from cleanup.models import Chunk, LedgerTotal, Run
from cleanup.observability.counters import (
    FOLD_AFTER,
    _total,
    chunk_sums,
    fold,
    ledger_figures,
    run_sums,
    unfold_trigger_sql,
)
from cleanup.retention import PURGE_CHUNKS
from tests.conftest import database_url
from tests.engine_app.factories import LeaseFactory

pytestmark = pytest.mark.django_db
LATER = FOLD_AFTER + timedelta(minutes=1)


def reported() -> tuple[dict, dict]:
    """The counters and chunk states a scrape reports (zeros left out)."""
    figures = ledger_figures()
    sums = {p: {k: v for k, v in values.items() if v} for p, values in figures.sums.items()}
    states = {p: {s: n for s, n in values.items() if n} for p, values in figures.states.items()}
    return sums, {p: values for p, values in states.items() if values}


def every_row() -> tuple[dict, dict]:
    """The same figures from a pass over every row, folded or not (no purge has run)."""
    sums = _total(chunk_sums(Chunk.objects.all()), run_sums(Run.objects.all()))
    sums = {p: {k: v for k, v in values.items() if v} for p, values in sums.items()}
    states = defaultdict(dict)
    for policy, state, n in (Chunk.objects.values_list("run__policy", "state")
                             .annotate(n=Count("pk")).order_by()):
        states[policy][state] = n
    return sums, dict(states)


@pytest.fixture
def ledger(account, chunk_size, dead_letter):
    """A completed run of four chunks with a duplicate delivery, and a run with a dead
    letter, as the worker leaves them."""
    LeaseFactory.create_batch(7, account=account, expired=True)
    chunk_size("expire-leases", 2)
    run = dispatch_in_process("expire-leases").run
    apply_chunk(run.chunks.order_by("chunk_id").first().message)  # a duplicate: a no-op
    assert Run.objects.get(pk=run.pk).state == Run.State.COMPLETED
    assert run.chunks.count() >= 4
    return run


def test_folding_settled_chunks_changes_no_figure(ledger):
    before = reported()
    assert before == every_row()

    assert fold() == 0  # finished just now: not settled yet
    folded = fold(timezone.now() + LATER)

    assert folded == Chunk.objects.count() and folded > 0
    assert not Chunk.objects.filter(folded=False).exists()
    assert reported() == before
    assert fold(timezone.now() + LATER) == 0  # nothing twice


def test_a_folded_chunk_replayed_counts_with_its_new_values(ledger, dead_letter):
    fold(timezone.now() + LATER)

    replay(ledger.id)  # every chunk re-sent: they unfold as they change
    for chunk in ledger.chunks.all():
        apply_chunk(chunk.message)
    replay(dead_letter.run_id)  # the dead letter requeued, its run reopened

    assert Chunk.objects.filter(folded=False).exists()
    assert reported() == every_row()
    sums, states = reported()
    assert states["expire-leases"].get("dead_lettered", 0) == 0
    assert sums["expire-leases"]["noop_deliveries"] >= ledger.chunks.count() + 1


def test_a_purge_of_folded_chunks_keeps_their_counters_and_drops_their_states(ledger):
    old = timezone.now() - timedelta(days=60)
    Chunk.objects.filter(run__policy="expire-leases").update(planned_at=old)
    Run.objects.filter(policy="expire-leases").update(finished_at=old)
    fold()
    assert not Chunk.objects.filter(run__policy="expire-leases", folded=False).exists()
    sums, states = reported()

    dispatch_in_process(PURGE_CHUNKS)

    assert not Chunk.objects.filter(run__policy="expire-leases").exists()
    after_sums, after_states = reported()
    assert after_sums["expire-leases"] == sums["expire-leases"]
    assert "expire-leases" not in after_states and states["expire-leases"]
    assert not LedgerTotal.objects.filter(policy="expire-leases", key__startswith="state_",
                                          value__gt=0).exists()


@pytest.mark.django_db(transaction=True)
def test_a_chunk_another_transaction_holds_waits_for_a_later_fold(ledger):
    held = ledger.chunks.order_by("chunk_id").first()
    locked, release = threading.Event(), threading.Event()

    def hold_the_row():
        with psycopg.connect(database_url()) as other:
            other.execute("SELECT 1 FROM cleanup_chunk WHERE id = %s FOR UPDATE", [held.pk])
            locked.set()
            release.wait(10)

    thread = threading.Thread(target=hold_the_row)
    thread.start()
    try:
        assert locked.wait(10)
        fold(timezone.now() + LATER)
        assert list(Chunk.objects.filter(folded=False).values_list("pk", flat=True)) == [held.pk]
        assert reported() == every_row()
    finally:
        release.set()
        thread.join()
    fold(timezone.now() + LATER)
    assert not Chunk.objects.filter(folded=False).exists()
    assert reported() == every_row()


def test_the_installed_trigger_is_the_one_the_aggregates_compile_to(db):
    """A change to the counters' aggregates needs a migration that installs the
    trigger again (see cleanup/migrations/0010_folded_chunks_and_ledger_indexes.py)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT prosrc FROM pg_proc WHERE proname = 'cleanup_chunk_unfold'")
        (installed,) = cursor.fetchone()
    assert installed == unfold_trigger_sql().split("$body$")[1]
