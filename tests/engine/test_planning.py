"""The streaming planner, walked from a run's span to its end, covers every eligible row
exactly once: ranges (per account and over the whole table) in order without overlap and
none wider than the cap, items as keyset pages; nothing beyond the span is planned."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cleanup.engine.frontier import NextId
from cleanup.engine.planning import next_chunk, span
from cleanup.policies import ITEMS, RANGE, get_policy
from tests.engine_app.factories import AccountFactory
from tests.engine_app.models import Account, Lease, LeaseLog

pytestmark = pytest.mark.django_db


def walk(policy, frozen, scheme, size, max_span=None):
    """Plan chunk after chunk from the span's first frontier, as a run's window does."""
    planned = span(policy, frozen, scheme)
    frontier, chunks = planned.frontier, []
    while frontier is not None:
        chunk, frontier = next_chunk(policy, frozen, scheme, frontier, size,
                                     span_end=planned.end, max_span=max_span)
        if chunk is not None:
            chunks.append(chunk)
        assert len(chunks) < 1000, "the frontier does not advance"
    return chunks


def check_ranges(ranges, ids, size, max_span):
    """``ranges`` (of one partition) cover exactly ``ids``, in order, each within bounds."""
    for left, right in zip(ranges, ranges[1:], strict=False):
        assert left.end_id <= right.start_id  # in order, no overlap
    for chunk in ranges:
        assert chunk.start_id < chunk.end_id
        if max_span is not None:
            assert chunk.end_id - chunk.start_id <= max_span
    covered = [[i for i in ids if r.start_id <= i < r.end_id] for r in ranges]
    assert [len(c) for c in covered] == [r.rows for r in ranges]
    assert all(0 < r.rows <= size for r in ranges)
    assert sum(covered, []) == ids


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(st.tuples(st.integers(0, 2), st.booleans()), min_size=0, max_size=40),
    size=st.integers(1, 7),
    max_span=st.one_of(st.none(), st.integers(1, 40)),
)
def test_ranges_per_account_cover_eligible_ids_once_within_their_bounds(rows, size, max_span):
    policy = get_policy("purge-lease-logs")
    now = timezone.now()
    LeaseLog.objects.all().delete()
    accounts = [Account.objects.get_or_create(name=f"A{i}")[0] for i in range(3)]
    LeaseLog.objects.bulk_create(
        LeaseLog(account=accounts[a], lease_id=0,
                 recorded_at=now - timedelta(days=90 if stale else 1))
        for a, stale in rows
    )
    eligible = {}
    for log in policy.eligible_rows(policy.freeze(now)).order_by("pk"):
        eligible.setdefault(log.account_id, []).append(log.pk)

    chunks = walk(policy, policy.freeze(now), RANGE, size, max_span)

    by_account = {}
    for chunk in chunks:
        by_account.setdefault(chunk.partition, []).append(chunk)
    assert list(by_account) == sorted(eligible)  # account after account
    for account, ranges in by_account.items():
        check_ranges(ranges, eligible[account], size, max_span)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    expired=st.lists(st.booleans(), min_size=0, max_size=50),
    size=st.integers(1, 9),
    max_span=st.one_of(st.none(), st.integers(1, 60)),
)
def test_ranges_over_the_whole_table_cover_eligible_ids_once(expired, size, max_span):
    policy = get_policy("expire-leases")
    now = timezone.now()
    Lease.objects.all().delete()
    account = AccountFactory()
    Lease.objects.bulk_create(
        Lease(account=account, holder=f"h{i}", state="active",
              expires_at=now + timedelta(minutes=-5 if gone else 5))
        for i, gone in enumerate(expired)
    )
    ids = list(policy.eligible_rows(policy.freeze(now)).order_by("pk")
               .values_list("pk", flat=True))

    chunks = walk(policy, policy.freeze(now), RANGE, size, max_span)

    assert {chunk.partition for chunk in chunks} <= {None}
    check_ranges(chunks, ids, size, max_span)


def test_rows_inserted_after_dispatch_lie_beyond_the_span(account):
    policy = get_policy("expire-leases")
    now = timezone.now()
    before = Lease.objects.create(account=account, holder="a",
                                  expires_at=now - timedelta(minutes=1))
    frozen = policy.freeze(now)
    planned = span(policy, frozen, RANGE)
    Lease.objects.create(account=account, holder="b", expires_at=now - timedelta(minutes=1))

    # A full chunk of one row: the frontier stays open after it.
    chunk, frontier = next_chunk(policy, frozen, RANGE, planned.frontier, 1,
                                 span_end=planned.end)
    assert (chunk.start_id, chunk.end_id, chunk.rows) == (before.pk, before.pk + 1, 1)
    assert frontier == NextId(before.pk + 1)
    assert next_chunk(policy, frozen, RANGE, frontier, 1, span_end=planned.end) == (None, None)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    minutes=st.lists(st.integers(-30, 30), min_size=0, max_size=40),
    size=st.integers(1, 9),
)
def test_items_pages_cover_eligible_rows_once_in_expiry_order(minutes, size):
    policy = get_policy("expire-leases")
    now = timezone.now()
    Lease.objects.all().delete()
    account = AccountFactory()
    Lease.objects.bulk_create(
        Lease(account=account, holder=f"h{i}", state="active",
              expires_at=now + timedelta(minutes=m))
        for i, m in enumerate(minutes)
    )
    expected = list(policy.eligible_rows(policy.freeze(now)).order_by("expires_at", "pk")
                    .values_list("pk", flat=True))

    chunks = walk(policy, policy.freeze(now), ITEMS, size)

    assert [pk for chunk in chunks for pk, _ in chunk.items] == expected
    assert all(0 < chunk.rows == len(chunk.items) <= size for chunk in chunks)


def test_an_empty_table_has_no_span(db):
    policy = get_policy("expire-leases")
    assert span(policy, policy.freeze(timezone.now()), RANGE).frontier is None
