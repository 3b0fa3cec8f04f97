"""How the console and the commands show ids, numbers, instants and states.

One format everywhere: ids by their first 8 hex digits (the whole id on hover),
counts with thousands separators, instants as 24-hour UTC with seconds (the exact
value on hover, a relative time beside it where it helps), states as badges whose
colour comes from the console's stylesheet (``cleanup/static/cleanup/console.css``),
a state the code does not know as ``unknown: <state>``.
"""

from __future__ import annotations

import uuid
from collections.abc import Container
from datetime import UTC, datetime

from django.utils import timezone
from django.utils.html import format_html

SHORT_ID_LENGTH = 8


def short_id(value) -> str:
    """The first 8 hex digits of a run's id, as the console shows it."""
    return str(value)[:SHORT_ID_LENGTH]


def number(value: int | None) -> str:
    """``123456`` as ``123,456``; nothing as an empty string."""
    return "" if value is None else f"{value:,}"


def utc_text(moment: datetime, *, date: bool = True) -> str:
    """``2026-12-01 23:33:08`` in UTC (or ``23:33:08`` without the date)."""
    moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S" if date else "%H:%M:%S")


def ago(moment: datetime, now: datetime | None = None) -> str:
    """How long ago (or how far ahead) an instant is, in its largest unit: ``3 min ago``."""
    seconds = ((now or timezone.now()) - moment).total_seconds()
    text = duration(abs(seconds))
    return f"{text} ago" if seconds >= 0 else f"in {text}"


def duration(seconds: float) -> str:
    """``4.2 s``, ``12 min``, ``3.5 h``, ``12 d``: short enough for a list column."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:,.0f} d"


def moment_html(moment: datetime | None, *, relative: bool = False, date: bool = True):
    """An instant for a list cell: UTC to the second, the exact ISO value on hover."""
    if moment is None:
        return "-"
    text = utc_text(moment, date=date)
    if relative:
        return format_html('<span class="moment" title="{}">{}<br><small>{}</small></span>',
                           moment.isoformat(timespec="microseconds"), text, ago(moment))
    return format_html('<span class="moment" title="{}">{}</span>',
                       moment.isoformat(timespec="microseconds"), text)


def id_html(value, url: str | None = None):
    """A run's short id, linked where a url is given, the whole id on hover."""
    if url is None:
        return format_html('<span class="short-id" title="{}">{}</span>', value,
                           short_id(value))
    return format_html('<a class="short-id" href="{}" title="{}">{}</a>', url, value,
                       short_id(value))


def badge(state: str, label: str, title: str = "", *, known: Container[str] | None = None,
          what: str = "state"):
    """A state as a coloured badge.

    A state outside ``known`` (one written by hand past the field's choices) reads
    ``unknown: <state>`` in the unknown colour, whatever label the caller had for it.
    """
    if known is not None and state not in known:
        return badge("unknown", f"unknown: {state}", f"a {what} the code does not know")
    css_state = "".join(c if c.isalnum() else "-" for c in str(state).lower())
    return format_html('<span class="state-badge state-{}" title="{}">{}</span>', css_state,
                       title or label, label)


def parse_id(text: str) -> uuid.UUID | str | None:
    """A full run id, an 8-hex-digit short id as text, or None for anything else."""
    text = (text or "").strip().lower()
    try:
        return uuid.UUID(text)
    except ValueError:
        pass
    if len(text) == SHORT_ID_LENGTH and all(c in "0123456789abcdef" for c in text):
        return text
    return None


def id_range(short: str) -> tuple[uuid.UUID, uuid.UUID]:
    """The ids that start with a short id: one range of the primary key (its index)."""
    return uuid.UUID(short + "0" * 24), uuid.UUID(short + "f" * 24)
