"""Queue tasks of the benchmark's one-task-per-row contender."""

from __future__ import annotations

from datetime import datetime

from reservations.models import SeatHold


def expire_one(pk: int, observed_expiry: str, cutoff: str) -> int:
    """Delete one hold if it is still held with the expiry it was planned with."""
    deleted, _ = SeatHold.objects.filter(
        pk=pk,
        status=SeatHold.Status.HELD,
        expires_at=datetime.fromisoformat(observed_expiry),
        expires_at__lte=datetime.fromisoformat(cutoff),
    ).delete()
    return deleted


def ready() -> bool:
    """A no-op the runner sends first, to know the cluster is taking work."""
    return True
