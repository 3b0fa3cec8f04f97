"""Any value a column can hold is eligible or not by the predicate, and nothing breaks on
it: planning, messages, the DELETE, metrics and the admin."""

from __future__ import annotations

from dataclasses import replace

import pytest
from django.db import connection
from django.db.models import Q
from django.urls import reverse

from cleanup.engine.dispatch import dispatch, dispatch_in_process
from cleanup.engine.worker import Outcome, apply_chunk
from cleanup.models import Chunk, OrphanMessage
from cleanup.policies import ITEMS, get_policy, register_policy
from tests.engine_app.factories import LeaseFactory
from tests.engine_app.models import Lease
from tests.observability.test_metrics import scrape, value

pytestmark = pytest.mark.django_db

# What the column holds, and whether the lease is eligible at a cutoff of now.
EXPIRIES = {"-infinity": True, "4713-01-01 00:00:00+00 BC": True,
            "infinity": False, "294276-12-31 00:00:00+00": False}


@pytest.fixture
def odd_leases(account):
    leases = {}
    for expiry in EXPIRIES:
        lease = LeaseFactory(account=account)
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {Lease._meta.db_table} SET expires_at = %s::timestamptz "
                "WHERE id = %s", [expiry, lease.pk])
        leases[expiry] = lease.pk
    return leases


@pytest.mark.parametrize("scheme", ["items", "range"])
def test_infinite_and_bc_expiries_are_eligible_by_the_predicate_alone(odd_leases, scheme):
    run = dispatch_in_process("expire-leases", scheme=scheme).run

    assert (run.state, run.candidates) == ("completed", 2)
    left = set(Lease.objects.values_list("pk", flat=True))
    assert left == {pk for expiry, pk in odd_leases.items() if not EXPIRIES[expiry]}


def test_items_messages_carry_what_postgresql_reads_back_exactly(odd_leases):
    chunk = dispatch("expire-leases").run.chunks.get()
    assert sorted(observed for _, observed in chunk.message["items"]) == [
        "-infinity", "4713-01-01 00:00:00+00 BC"]
    assert apply_chunk(chunk.message) == Outcome.DELETED
    assert apply_chunk(chunk.message) == Outcome.NOOP


def test_metrics_and_the_admin_read_infinite_expiries(client, admin_client, odd_leases):
    samples = scrape(client)
    assert value(samples, "cleanup_oldest_eligible_age_seconds",
                 policy="expire-leases") > 60e9  # since year 1
    url = reverse("admin:cleanup_cleanupoverview_changelist")
    assert admin_client.get(url).status_code == 200, url


@pytest.fixture
def nullable_policy(chunk_size):
    """Discarded chunks, observed by their (empty) committed_at: a nullable column."""
    return register_policy(replace(get_policy("expire-leases"), name="discarded-chunks",
                                   model_label="cleanup.Chunk",
                                   observed_field="committed_at", partition_field="run",
                                   scheme=ITEMS, derive=None,
                                   eligible=lambda cutoff: Q(state=Chunk.State.DISCARDED)))


def test_rows_whose_observed_value_is_null_are_planned_and_deleted(nullable_policy,
                                                                   expired_leases):
    leases_run = dispatch("expire-leases", scheme="range").run
    Chunk.objects.filter(run=leases_run).update(state=Chunk.State.DISCARDED)
    doomed = set(Chunk.objects.values_list("pk", flat=True))

    run = dispatch_in_process("discarded-chunks").run

    assert run.chunks.get().message["items"] == [[pk, None] for pk in sorted(doomed)]
    assert not Chunk.objects.filter(pk__in=doomed).exists()


def test_a_malformed_message_naming_a_finished_chunk_is_kept_and_logged(expired_leases, caplog):
    chunk = dispatch("expire-leases").run.chunks.get()
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
