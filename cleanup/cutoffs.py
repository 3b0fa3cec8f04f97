"""Parse and validate the cutoff a run freezes."""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone

from cleanup.exceptions import BadCutoff


def parse_cutoff(text: str) -> datetime:
    """Parse an ISO-8601 timestamp that carries its offset."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise BadCutoff(f"cutoff {text!r} is not an ISO-8601 timestamp") from None
    return value


def frozen_cutoff(cutoff: datetime | None, *, not_before: datetime | None = None) -> datetime:
    """Return the cutoff to freeze: now by default; refuse naive or future ones."""
    now = timezone.now()
    if cutoff is None:
        return now
    if timezone.is_naive(cutoff):
        raise BadCutoff(f"cutoff {cutoff.isoformat()} has no timezone offset")
    if cutoff > now:
        raise BadCutoff(f"cutoff {cutoff.isoformat()} is in the future (now is {now.isoformat()})")
    if not_before is not None and cutoff < not_before:
        raise BadCutoff(
            f"cutoff {cutoff.isoformat()} is before the original run's {not_before.isoformat()}"
        )
    return cutoff
