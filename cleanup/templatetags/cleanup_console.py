"""The console's formats in templates: the same as its lists (cleanup.display)."""

from __future__ import annotations

from django import template

from cleanup import display
from cleanup.console import badges

register = template.Library()


@register.filter
def state_badge(obj):
    """A chunk's or a run's state as its badge, as the lists show it (unknown included)."""
    return badges.state_badge(obj)


@register.filter
def number(value):
    return display.number(value)


@register.filter
def moment(value):
    return display.moment_html(value)


@register.filter
def ago(value):
    return display.ago(value) if value else "-"


@register.filter
def short_id(value):
    return display.short_id(value)


@register.filter
def seconds(value):
    """A duration in seconds (or a timedelta) as the lists show it: ``12 min``."""
    if value is None:
        return "-"
    return display.duration(getattr(value, "total_seconds", lambda: value)())
