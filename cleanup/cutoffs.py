"""Parse and validate the instants a run freezes: its cutoff and what a policy derives.

Every instant is stored in UTC. PostgreSQL refuses offsets past 15:59 or with
fractional seconds, and stores an instant before year 1 in UTC as a BC timestamp
that psycopg cannot read back; converting to UTC first turns the first two into
ordinary instants and shows the last as the overflow it is.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.utils import timezone

from cleanup.exceptions import BadCutoff


def parse_cutoff(text: str, what: str = "cutoff") -> datetime:
    """Parse an ISO-8601 timestamp that carries its offset, as an instant in UTC."""
    if not text or not text.strip():
        raise BadCutoff(f"{what} is empty (give an ISO-8601 timestamp with its offset)")
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise BadCutoff(f"{what} {text!r} is not an ISO-8601 timestamp") from None
    return in_utc(value, what)


def in_utc(value: datetime, what: str = "cutoff") -> datetime:
    """Return an aware instant in UTC; refuse naive ones and those outside years 1-9999."""
    if timezone.is_naive(value):
        raise BadCutoff(f"{what} {value.isoformat()} has no timezone offset")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise BadCutoff(
            f"{what} {value.isoformat()} falls outside years 1 to 9999 in UTC"
        ) from None


def frozen_cutoff(cutoff: datetime | None, *, not_before: datetime | None = None) -> datetime:
    """Return the cutoff to freeze, in UTC: now by default; refuse naive or future ones."""
    now = timezone.now()
    if cutoff is None:
        return now
    cutoff = in_utc(cutoff)
    if cutoff > now:
        raise BadCutoff(f"cutoff {cutoff.isoformat()} is in the future (now is {now.isoformat()})")
    if not_before is not None and cutoff < not_before:
        raise BadCutoff(
            f"cutoff {cutoff.isoformat()} is before the original run's {not_before.isoformat()}"
        )
    return cutoff
