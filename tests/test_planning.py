"""Range chunks cover each tenant's eligible ids exactly: no overlap, no row twice, none
missed; without a span cap they tile the span, with one none is wider than the cap."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cleanup.planning import plan_ranges
from cleanup.policies import get_policy
from reservations.models import ReminderAttempt, Tenant

pytestmark = pytest.mark.django_db


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(st.tuples(st.integers(0, 2), st.booleans()), min_size=0, max_size=40),
    size=st.integers(1, 7),
    max_span=st.one_of(st.none(), st.integers(1, 40)),
)
def test_ranges_cover_eligible_ids_once_within_their_bounds(rows, size, max_span):
    policy = get_policy("purge-reminder-attempts")
    now = timezone.now()
    ReminderAttempt.objects.all().delete()
    tenants = [Tenant.objects.get_or_create(name=f"T{i}")[0] for i in range(3)]
    ReminderAttempt.objects.bulk_create(
        ReminderAttempt(tenant=tenants[t], hold_id=0, learner_ref="x",
                        sent_at=now - timedelta(days=90 if stale else 1))
        for t, stale in rows
    )
    eligible = {}
    for attempt in policy.eligible_rows(policy.freeze(now)):
        eligible.setdefault(attempt.tenant_id, []).append(attempt.pk)

    chunks = list(plan_ranges(policy, policy.freeze(now), size, max_span))

    by_tenant = {}
    for chunk in chunks:
        assert chunk.start_id < chunk.end_id
        by_tenant.setdefault(chunk.partition, []).append(chunk)
    assert by_tenant.keys() == eligible.keys()
    for tenant, ranges in by_tenant.items():
        ids = sorted(eligible[tenant])
        assert ranges[0].start_id == ids[0]
        assert ranges[-1].end_id == ids[-1] + 1
        for left, right in zip(ranges, ranges[1:], strict=False):
            if max_span is None:
                assert left.end_id == right.start_id  # adjacent: no gap, no overlap
            else:
                assert left.end_id <= right.start_id  # in order, no overlap
        if max_span is not None:
            assert all(r.end_id - r.start_id <= max_span for r in ranges)
        covered = [[i for i in ids if r.start_id <= i < r.end_id] for r in ranges]
        assert [len(c) for c in covered] == [r.rows for r in ranges]
        assert all(0 < r.rows <= size for r in ranges)
        assert sum(covered, []) == ids
