"""Read timestamps PostgreSQL holds beyond Python's years: ±infinity, BC, after 9999.

A hold's expiry may be any value its column holds, and psycopg raises on the ones a
datetime cannot carry, which broke every admin page listing such a hold. They are read
as the first or last instant Python has; cleanup compares them in SQL only, as they are.
"""

from __future__ import annotations

from datetime import datetime

from psycopg import DataError
from psycopg.types.datetime import TimestampLoader, TimestamptzLoader


def clamped(data) -> datetime:
    """The naive datetime nearest to a timestamp's text that psycopg could not load."""
    text = bytes(data)
    return datetime.min if text.startswith(b"-") or text.endswith(b"BC") else datetime.max


def install_loaders(sender, connection, **kwargs) -> None:
    """On each new PostgreSQL connection, load out-of-range timestamps clamped."""
    if connection.vendor != "postgresql":
        return

    class ClampingTimestamptzLoader(TimestamptzLoader):
        # Django's cursors keep a connection's loader whose timezone matches theirs.
        timezone = connection.timezone

        def load(self, data):
            try:
                value = super().load(data)
            except DataError:
                value = clamped(data)
            return value.replace(tzinfo=self.timezone)

    class ClampingTimestampLoader(TimestampLoader):
        # What truncated dates come back as (the admin's date hierarchy).
        def load(self, data):
            try:
                return super().load(data)
            except DataError:
                return clamped(data)

    adapters = connection.connection.adapters
    adapters.register_loader("timestamptz", ClampingTimestamptzLoader)
    adapters.register_loader("timestamp", ClampingTimestampLoader)
