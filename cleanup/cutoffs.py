"""Parse and validate the instants a run freezes: its cutoff and what a policy derives.

PostgreSQL refuses UTC offsets past 15:59:59 or with fractional seconds, and stores
an instant before year 1 in UTC as a BC timestamp that psycopg cannot read back (every
page listing that run would fail). Both are refused here, before anything is written;
what passes is stored in UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.utils import timezone

from cleanup.exceptions import BadCutoff

# The widest UTC offset PostgreSQL takes (it refuses +16:00).
MAX_OFFSET = timedelta(hours=15, minutes=59, seconds=59)


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
    """Return an aware instant in UTC; refuse naive ones, offsets PostgreSQL refuses, and
    instants outside years 1 to 9999 in UTC."""
    if timezone.is_naive(value):
        raise BadCutoff(f"{what} {value.isoformat()} has no timezone offset")
    offset = value.utcoffset()
    if offset.microseconds or abs(offset) > MAX_OFFSET:
        raise BadCutoff(
            f"{what} {value.isoformat()}: PostgreSQL takes UTC offsets up to ±15:59:59, "
            "in whole seconds"
        )
    try:
        return value.astimezone(UTC)
    except OverflowError:
        edge = "before year 1" if value.year == 1 else "after year 9999"
        raise BadCutoff(f"{what} {value.isoformat()} falls {edge} in UTC") from None


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
