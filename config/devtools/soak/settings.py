"""Settings of the soak's qcluster processes: short leases, the poison policy, reminders
that fall due within seconds. The soak's own process runs with the same values
(runner.run_soak, pinned by tests/project/test_soak.py)."""

from config.dev_settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "config.devtools.soak"]  # noqa: F405
# Short leases so redeliveries and rescues happen within a soak of a minute:
# timeout 4 s (a chunk takes milliseconds), retry 6 s, lease 10 s.
Q_CLUSTER = {**Q_CLUSTER, "timeout": 4, "retry": 6, "poll": 0.1, "workers": 2}  # noqa: F405
CLEANUP_MAX_UNFINISHED_DELIVERIES = 3
CLEANUP_LOCK_TIMEOUT_MS = 3000
# Its faults catch a chunk's statement waiting on a row they lock, to kill it there:
# the statement waits as long as the lock timeout, not 50 ms, before it skips the row.
CLEANUP_ROW_LOCK_WAIT_MS = 3000
# The soak wants many small chunks in flight: no learning of bigger ones.
CLEANUP_CHUNK_BUDGET_MS = 0
# A reminder falls due 10 s after its hold is made or renewed, so reminders come due
# all through a soak; a hold still outlasts a soak (renewed holds must never expire).
# The sender (which runs here) and the learners' renewals must agree on the lead.
RESERVATIONS_HOLD_MINUTES = 15
RESERVATIONS_REMINDER_LEAD_MINUTES = 15 - 10 / 60
# A sender run stops taking reminders well inside the 4 s task timeout.
RESERVATIONS_REMINDER_SEND_SECONDS = 2
# Reminder mails go nowhere; the soak counts the attempts the sender records.
EMAIL_BACKEND = "django.core.mail.backends.dummy.EmailBackend"
# An outbox event whose publisher the soak killed is taken again within seconds, not
# minutes: the soak drains the rest after its faults and checks every event delivered.
CLEANUP_EVENT_BACKOFF_SECONDS = 1
CLEANUP_EVENT_BACKOFF_MAX_SECONDS = 8
