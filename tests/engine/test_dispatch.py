"""Dispatch: a frozen cutoff, one run per key, and run, chunks and messages in one commit."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from cleanup.display import utc_text
from cleanup.engine import transport
from cleanup.engine.dispatch import (
    describe_dispatch,
    dispatch,
    dispatch_in_process,
    preview_dispatch,
)
from cleanup.engine.transport import CHUNK_TASK
from cleanup.exceptions import BadCutoff, BadKey, BadScheme, KeyReused, UnknownPolicy
from cleanup.models import Chunk, Run
from tests.conftest import chunks_of
from tests.engine_app.factories import AccountFactory, LeaseFactory, LeaseLogFactory
from tests.engine_app.models import Lease

pytestmark = pytest.mark.django_db


def test_cutoff_is_frozen_once_on_the_run_and_in_every_message(expired_leases, chunk_size):
    chunk_size("expire-leases", 2)
    result = dispatch("expire-leases")

    chunks = chunks_of(result.run)
    assert len(chunks) == 3
    assert {c.message["cutoff"] for c in chunks} == {result.run.cutoff.isoformat()}
    assert result.run.cutoff <= timezone.now()


def test_future_cutoff_is_refused_and_nothing_written(expired_leases):
    with pytest.raises(BadCutoff, match="in the future"):
        dispatch("expire-leases", cutoff=timezone.now() + timedelta(minutes=1))
    assert Run.objects.count() == 0


def test_naive_cutoff_is_refused(expired_leases):
    with pytest.raises(BadCutoff, match="no timezone"):
        dispatch("expire-leases", cutoff=timezone.now().replace(tzinfo=None))


def test_unknown_policy_and_scheme_are_refused(db):
    with pytest.raises(UnknownPolicy, match="expire-leases"):
        dispatch("no-such-policy")
    with pytest.raises(BadScheme):
        dispatch("expire-leases", scheme="diagonal")
    assert Run.objects.count() == 0


def test_two_dispatches_with_one_key_give_one_run(expired_leases):
    first = dispatch("expire-leases", key="k1")
    second = dispatch("expire-leases", key="k1", scheme="items", cutoff=first.run.cutoff)

    assert (first.created, second.created) == (True, False)
    assert second.run.pk == first.run.pk
    assert Run.objects.count() == 1


@pytest.mark.parametrize("contradiction", [
    {"policy_name": "purge-lease-logs"},
    {"scheme": "range"},
    {"cutoff": timezone.now() - timedelta(days=1)},
])
def test_a_reused_key_with_a_contradicting_request_is_refused(expired_leases, contradiction):
    first = dispatch("expire-leases", key="k1").run
    request = {"policy_name": "expire-leases", **contradiction}

    with pytest.raises(KeyReused, match=f"belongs to run {first.pk}"):
        dispatch(key="k1", **request)
    assert list(Run.objects.values_list("pk", flat=True)) == [first.pk]


def test_an_unknown_policy_is_refused_even_with_a_used_key(expired_leases):
    dispatch("expire-leases", key="k1")
    with pytest.raises(UnknownPolicy):
        dispatch("no-such-policy", key="k1")


@pytest.mark.parametrize("key, error", [("", "empty"), ("   ", "empty"),
                                        ("k" * 256, "256 characters long; the limit is 255")])
def test_an_empty_or_overlong_key_is_refused_and_nothing_written(expired_leases, key, error):
    with pytest.raises(BadKey, match=error):
        dispatch("expire-leases", key=key)
    assert (Run.objects.count(), OrmQ.objects.count()) == (0, 0)


def test_run_chunks_and_queue_messages_commit_together(expired_leases, chunk_size):
    chunk_size("expire-leases", 2)
    run = dispatch("expire-leases").run

    queued = [SignedPackage.loads(q.payload) for q in OrmQ.objects.order_by("id")]
    assert [task["func"] for task in queued] == [CHUNK_TASK] * 3
    assert [task["args"][0] for task in queued] == [c.message for c in chunks_of(run)]
    assert {c.state for c in chunks_of(run)} == {Chunk.State.ENQUEUED}


def test_failure_while_planning_leaves_no_run_chunk_or_message(expired_leases, monkeypatch):
    def broken_broker(*args, **options):
        raise RuntimeError("injected: broker down")

    monkeypatch.setattr(transport, "async_task", broken_broker)
    with pytest.raises(RuntimeError):
        dispatch("expire-leases", key="k2")

    assert (Run.objects.count(), Chunk.objects.count(), OrmQ.objects.count()) == (0, 0, 0)


def test_items_chunks_carry_pk_and_observed_expiry(expired_leases, account):
    LeaseFactory(account=account)  # active: not a candidate
    result = dispatch("expire-leases")

    (chunk,) = chunks_of(result.run)
    expected = [[h.pk, h.expires_at.isoformat()] for h in expired_leases]
    assert chunk.message["items"] == expected
    assert (chunk.message["version"], chunk.message["parameters"]) == (4, {})
    assert result.candidates == 5


def test_empty_backlog_gives_a_completed_run_without_chunks(db):
    result = dispatch("expire-leases")
    assert (result.chunks, result.run.state) == (0, Run.State.COMPLETED)


def test_dry_run_counts_and_writes_nothing(expired_leases, chunk_size):
    chunk_size("expire-leases", 2)
    result = preview_dispatch("expire-leases")

    assert (result.run, result.candidates, result.chunks) == (None, 5, 3)
    assert (Run.objects.count(), OrmQ.objects.count()) == (0, 0)


def test_any_policy_can_use_the_other_scheme(expired_leases):
    result = dispatch("expire-leases", scheme="range")
    (chunk,) = chunks_of(result.run)
    assert "partition" not in chunk.message  # expire-leases ranges span the whole table
    assert chunk.message["start_id"] == expired_leases[0].pk
    assert chunk.message["end_id"] == expired_leases[-1].pk + 1


def test_whole_table_ranges_tile_every_account_eligible_ids_in_bounded_chunks(db, chunk_size):
    chunk_size("expire-leases", 3)
    leases = [LeaseFactory(expired=True) for _ in range(7)]  # seven accounts, interleaved
    LeaseFactory()  # active: not a candidate

    chunks = chunks_of(dispatch("expire-leases", scheme="range").run)

    assert [c.planned_rows for c in chunks] == [3, 3, 1]
    spans = [(c.message["start_id"], c.message["end_id"]) for c in chunks]
    assert spans[0][0] == leases[0].pk and spans[-1][1] == leases[-1].pk + 1
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))  # no gap
    assert len({lease.account_id for lease in leases}) == 7


def test_sync_dispatch_applies_chunks_without_the_queue(expired_leases):
    result = dispatch_in_process("expire-leases")

    result.run.refresh_from_db()
    assert result.run.state == Run.State.COMPLETED
    assert OrmQ.objects.count() == 0
    assert {c.state for c in chunks_of(result.run)} == {Chunk.State.ACKNOWLEDGED}


def test_django_q_sync_mode_applies_chunks_after_the_run_commits(
        expired_leases, q_sync, chunk_size, django_capture_on_commit_callbacks):
    chunk_size("expire-leases", 2)  # three chunks: those planned as others commit too
    with django_capture_on_commit_callbacks(execute=True) as inline:
        result = dispatch("expire-leases")
        # Nothing ran inside the dispatch's transaction: the chunks wait for its commit.
        assert Chunk.objects.filter(state__in=Chunk.DONE).count() == 0
    assert inline
    result.run.refresh_from_db()
    assert result.run.state == Run.State.COMPLETED
    assert sum(c.rows_deleted for c in chunks_of(result.run)) == 5


def test_range_scheme_plans_per_account(db, chunk_size):
    chunk_size("purge-lease-logs", 2)
    first, second = LeaseLogFactory.create_batch(2, stale=True)
    LeaseLogFactory.create_batch(3, stale=True, account=first.account)
    LeaseLogFactory(account=first.account)  # within retention

    chunks = chunks_of(dispatch("purge-lease-logs").run)

    per_account = {}
    for c in chunks:
        per_account.setdefault(c.message["partition"], []).append(c.planned_rows)
    assert per_account == {first.account_id: [2, 2], second.account_id: [1]}


def test_interrupted_sync_run_is_finished_by_dispatching_its_key_again(
    expired_leases, chunk_size, monkeypatch
):
    from cleanup.engine import transitions

    chunk_size("expire-leases", 2)
    real_record = transitions.to_committed
    committed = []

    def die_on_second_chunk(chunk, *args, **kwargs):
        if committed:
            raise KeyboardInterrupt("injected: process stopped mid-run")
        committed.append(chunk.chunk_id)
        real_record(chunk, *args, **kwargs)

    monkeypatch.setattr(transitions, "to_committed", die_on_second_chunk)
    with pytest.raises(KeyboardInterrupt):
        dispatch_in_process("expire-leases", key="small-table")
    monkeypatch.setattr(transitions, "to_committed", real_record)

    again = dispatch_in_process("expire-leases", key="small-table")

    again.run.refresh_from_db()
    assert again.created is False
    assert again.run.state == Run.State.COMPLETED
    assert Lease.objects.count() == 0


def expired_backlog(rows: int) -> None:
    account = AccountFactory()
    expired = timezone.now() - timedelta(hours=1)
    Lease.objects.bulk_create(
        Lease(account=account, holder=f"holder-{i}", expires_at=expired - timedelta(seconds=i))
        for i in range(rows))


def test_dispatch_says_the_rows_eligible_and_its_first_window_with_separators(db, chunk_size):
    from structlog.testing import capture_logs

    chunk_size("expire-leases", 2)
    expired_backlog(1234)
    LeaseFactory()  # expires in the future: not eligible

    with capture_logs() as logs:
        result = dispatch("expire-leases")

    run = result.run
    expected = (f"Dispatched run {run.id} of expire-leases (items, cutoff "
                f"{utc_text(run.cutoff)} UTC): 1,234 rows eligible; first 4 chunks planned "
                "(8 rows), the rest as they finish.")
    assert describe_dispatch(result) == expected
    assert (result.eligible, result.first_chunks, result.first_rows) == (1234, 4, 8)
    assert run.eligible_at_dispatch == 1234
    (logged,) = [line for line in logs if line["event"] == "dispatched"]
    assert (logged["eligible"], logged["first_chunks"], logged["first_rows"]) == (1234, 4, 8)
    assert logged["summary"] == expected


def test_a_dispatch_behind_a_full_window_says_which_run_it_waits_behind(expired_leases,
                                                                        settings, chunk_size):
    settings.CLEANUP_WINDOW = 1
    chunk_size("expire-leases", 2)
    first = dispatch("expire-leases", key="first").run

    second = dispatch("expire-leases", key="second")

    assert (second.first_chunks, second.waiting_behind) == (0, first.pk)
    assert describe_dispatch(second).endswith(
        f": 5 rows eligible; waiting for room in the window behind run {first.pk}.")


def test_dispatch_command_json_carries_what_the_sentence_says(expired_leases, settings,
                                                              chunk_size):
    settings.CLEANUP_WINDOW = 1
    chunk_size("expire-leases", 2)
    first = dispatch("expire-leases", key="first").run
    out = StringIO()

    call_command("cleanup_dispatch", "--policy", "expire-leases", "--json", stdout=out)

    result = json.loads(out.getvalue())
    assert (result["eligible"], result["first_chunks"], result["first_rows"]) == (5, 0, 0)
    assert result["waiting_behind"] == str(first.pk)
    assert result["sync"] is None
    assert result["summary"] == (
        f"Dispatched run {result['run_id']} of expire-leases (items, cutoff "
        f"{utc_text(Run.objects.get(pk=result['run_id']).cutoff)} UTC): 5 rows eligible; "
        f"waiting for room in the window behind run {first.pk}.")


class Terminal(StringIO):
    def isatty(self) -> bool:
        return True


def test_sync_progress_says_the_rows_changed_of_the_rows_eligible(db, chunk_size):
    chunk_size("expire-leases", 500)
    expired_backlog(1200)
    out, progress = StringIO(), Terminal()

    call_command("cleanup_dispatch", "--policy", "expire-leases", "--sync", stdout=out,
                 stderr=progress)

    assert progress.getvalue().split("\r")[1:] == [
        "Applied 1 chunk: 500 of 1,200 rows changed",
        "Applied 2 chunks: 1,000 of 1,200 rows changed",
        "Applied 3 chunks: 1,200 of 1,200 rows changed\n",
    ]
    assert ("1,200 rows eligible; 3 chunks planned (1,200 rows); applied here: 1,200 of "
            "1,200 rows deleted in 3 chunks. State completed;") in out.getvalue()
