"""What changes a lease under a planned chunk: each a single UPDATE of the row."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from tests.engine_app.models import Lease


def renew_lease(lease_id: int) -> None:
    """Move the lease's expiry a quarter of an hour past now."""
    Lease.objects.filter(pk=lease_id).update(expires_at=timezone.now() + timedelta(minutes=15))


def keep_lease(lease_id: int) -> None:
    """Keep the lease for good: it never lapses."""
    Lease.objects.filter(pk=lease_id).update(state=Lease.State.KEPT)


def count_leases() -> int:
    """A host's scheduled task that reads the leases' table."""
    return Lease.objects.count()
