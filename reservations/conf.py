"""The product's settings under RESERVATIONS_*."""

from __future__ import annotations

from django.conf import settings


class PrefixedSettings:
    """Attribute access to <PREFIX>_<NAME> in settings, falling back to defaults.

    Read on every access, so the pytest ``settings`` fixture and override_settings work.
    """

    def __init__(self, prefix: str, defaults: dict):
        self._prefix = prefix
        self._defaults = defaults

    def __getattr__(self, name: str):
        if name.startswith("_") or name not in self._defaults:
            raise AttributeError(name)
        return getattr(settings, f"{self._prefix}_{name}", self._defaults[name])


conf = PrefixedSettings(
    "RESERVATIONS",
    {
        # How long a seat stays held without a renewal or a confirmation.
        "HOLD_MINUTES": 15,
        # How long a seat offered to the first learner on a waitlist stays held for
        # them before it goes to the next (system check reservations.E005).
        "OFFER_MINUTES": 30,
        # Reminder attempts are purged once older than this.
        "REMINDER_RETENTION_DAYS": 30,
        # A held seat's renewal reminder is due this long before the hold expires.
        "REMINDER_LEAD_MINUTES": 5,
        # How a learner_ref becomes the address a reminder goes to.
        "LEARNER_EMAIL": "{learner_ref}@learners.example.edu",
        # Ready reminders one run of the sender takes at most, and for how long it
        # takes new ones (django-q2's task timeout is 120 s).
        "REMINDER_SEND_BATCH": 5000,
        "REMINDER_SEND_SECONDS": 50,
        # Sends of one reminder (since its hold was last renewed) before the sender
        # gives up on it and marks it failed: temporary refusals, and sends that
        # started and never finished (system check reservations.E003).
        "REMINDER_MAX_ATTEMPTS": 5,
        # A reminder claimed for sending longer ago than this is taken over by the next
        # run: its sender died. Above django-q2's task timeout, which ends any sender
        # still alive sooner (system check reservations.E004).
        "REMINDER_CLAIM_SECONDS": 300,
        "EXPIRE_CHUNK_SIZE": 500,
        "MARK_READY_CHUNK_SIZE": 500,
        "PURGE_CHUNK_SIZE": 1000,
        # django-q2 cron expressions of the cleanup schedules and of the sender.
        "EXPIRE_SCHEDULE": "* * * * *",
        "PURGE_SCHEDULE": "15 * * * *",
        "MARK_READY_SCHEDULE": "* * * * *",
        "REMINDER_SEND_SCHEDULE": "* * * * *",
    },
)
