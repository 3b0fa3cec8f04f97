"""The one guarded wipe of the development tools: both the benchmark and the soak
empty every reservation table before they start."""

from __future__ import annotations

from django.core.management.base import CommandError
from django.db import connection
from django_q.models import Schedule

from reservations.management.wiping import confirm_wipe
from reservations.models import Reminder, ReminderAttempt, SeatHold, Section, Tenant


def guard(tool: str, interactive: bool) -> None:
    """Refuse a database with cleanup schedules installed (their runs would race the
    tool), then ask unless --noinput; nothing is changed before both pass."""
    scheduled = list(Schedule.objects.filter(func__startswith="cleanup.").values_list(
        "name", flat=True))
    if scheduled:
        raise CommandError(
            f"this database has cleanup schedules installed ({', '.join(scheduled)}); their "
            f"runs would race {tool.lower()}. Point DATABASE_URL at a database of its own; "
            "nothing changed."
        )
    confirm_wipe(tool, interactive)


def wipe_reservations() -> None:
    """Empty the reservation tables (after ``guard``)."""
    with connection.cursor() as cursor:
        for model in (Reminder, ReminderAttempt, SeatHold, Section, Tenant):
            # CASCADE: the tables reference each other; all of them are emptied.
            cursor.execute(f'TRUNCATE "{model._meta.db_table}" CASCADE')
