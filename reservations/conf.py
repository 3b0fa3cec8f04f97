"""The product's settings under RESERVATIONS_*."""

from cleanup.conf import PrefixedSettings

conf = PrefixedSettings(
    "RESERVATIONS",
    {
        # How long a seat stays held without a renewal or a confirmation.
        "HOLD_MINUTES": 15,
        # Reminder attempts are purged once older than this.
        "REMINDER_RETENTION_DAYS": 30,
        "EXPIRE_CHUNK_SIZE": 500,
        "PURGE_CHUNK_SIZE": 1000,
        # django-q2 cron expressions of the two cleanup schedules.
        "EXPIRE_SCHEDULE": "* * * * *",
        "PURGE_SCHEDULE": "15 * * * *",
    },
)
