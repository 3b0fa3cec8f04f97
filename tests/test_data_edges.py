"""Any value a column can hold is eligible or not by the predicate, and nothing breaks on
it: planning, messages, the DELETE, metrics and the admin."""

from __future__ import annotations

from dataclasses import replace

import pytest
from django.db import connection
from django.db.models import Q
from django.urls import reverse

from cleanup.dispatch import dispatch
from cleanup.models import Chunk, OrphanMessage
from cleanup.policies import ITEMS, get_policy, register
from cleanup.worker import Outcome, apply_chunk
from reservations.models import SeatHold
from tests.factories import SeatHoldFactory
from tests.test_metrics import HOLDS, scrape, value

pytestmark = pytest.mark.django_db

# What the column holds, and whether the hold is eligible at a cutoff of now.
EXPIRIES = {"-infinity": True, "4713-01-01 00:00:00+00 BC": True,
            "infinity": False, "294276-12-31 00:00:00+00": False}


@pytest.fixture
def odd_holds(section):
    holds = {}
    for expiry in EXPIRIES:
        hold = SeatHoldFactory(section=section)
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {SeatHold._meta.db_table} SET expires_at = %s::timestamptz "
                "WHERE id = %s", [expiry, hold.pk])
        holds[expiry] = hold.pk
    return holds


@pytest.mark.parametrize("scheme", ["items", "range"])
def test_infinite_and_bc_expiries_are_eligible_by_the_predicate_alone(odd_holds, scheme):
    run = dispatch("expire-holds", scheme=scheme, sync=True).run

    assert (run.state, run.candidates) == ("completed", 2)
    left = set(SeatHold.objects.values_list("pk", flat=True))
    assert left == {pk for expiry, pk in odd_holds.items() if not EXPIRIES[expiry]}


def test_items_messages_carry_what_postgresql_reads_back_exactly(odd_holds):
    chunk = dispatch("expire-holds").run.chunks.get()
    assert sorted(observed for _, observed in chunk.message["items"]) == [
        "-infinity", "4713-01-01 00:00:00+00 BC"]
    assert apply_chunk(chunk.message) == Outcome.DELETED
    assert apply_chunk(chunk.message) == Outcome.NOOP


def test_metrics_and_the_admin_read_infinite_expiries(client, admin_client, odd_holds):
    samples = scrape(client)
    assert value(samples, "cleanup_oldest_eligible_age_seconds", **HOLDS) > 60e9  # since year 1
    for url in (reverse("admin:reservations_seathold_changelist"),
                reverse("admin:reservations_seathold_change", args=[odd_holds["-infinity"]]),
                reverse("admin:cleanup_cleanupoverview_changelist")):
        assert admin_client.get(url).status_code == 200, url


@pytest.fixture
def nullable_policy(chunk_size):
    """Discarded chunks, observed by their (empty) committed_at: a nullable column."""
    return register(replace(get_policy("expire-holds"), name="discarded-chunks",
                            model_label="cleanup.Chunk", observed_field="committed_at",
                            partition_field="run", scheme=ITEMS, derive=None,
                            eligible=lambda cutoff: Q(state=Chunk.State.DISCARDED)))


def test_rows_whose_observed_value_is_null_are_planned_and_deleted(nullable_policy,
                                                                   expired_holds):
    holds_run = dispatch("expire-holds", scheme="range").run
    Chunk.objects.filter(run=holds_run).update(state=Chunk.State.DISCARDED)
    doomed = set(Chunk.objects.values_list("pk", flat=True))

    run = dispatch("discarded-chunks", sync=True).run

    assert run.chunks.get().message["items"] == [[pk, None] for pk in sorted(doomed)]
    assert not Chunk.objects.filter(pk__in=doomed).exists()


def test_a_malformed_message_naming_a_finished_chunk_is_kept_and_logged(expired_holds, caplog):
    chunk = dispatch("expire-holds").run.chunks.get()
    apply_chunk(chunk.message)
    malformed = {**chunk.message, "version": 99}

    assert apply_chunk(malformed) == Outcome.DEAD_LETTERED

    orphan = OrphanMessage.objects.get()
    assert (str(orphan.run_id), orphan.chunk_id) == (str(chunk.run_id), chunk.chunk_id)
    assert "unknown message version 99" in orphan.error and "already committed" in orphan.error
    events = [r.msg for r in caplog.records if isinstance(r.msg, dict)]
    assert any(e["event"] == "orphan message dead-lettered" and e["chunk_id"] == chunk.chunk_id
               for e in events)
    chunk.refresh_from_db()
    assert chunk.state == Chunk.State.COMMITTED


@pytest.mark.parametrize("raw", ["\x00\x1e", {"version": 3, "run_id": "00000000-0000-0000-0000"
                                              "-000000000000", "chunk_id": -1},
                                 {"version": 3, "chunk_id": 10**30}])
def test_any_malformed_message_is_kept_as_an_orphan_whatever_it_holds(db, raw):
    assert apply_chunk(raw) == Outcome.DEAD_LETTERED
    orphan = OrphanMessage.objects.get()
    assert orphan.chunk_id is None and "\x00" not in orphan.raw
