"""The project's settings for the end-to-end alert test: the same app, with the waits
an operator would wait for made short enough for a test."""

import os

from config.settings import *  # noqa: F403

# Missed once the scheduler is 40 s late: above django-q2's 30-second scheduler pass.
CLEANUP_SCHEDULE_GRACE_SECONDS = 40
# A chunk stuck on row locks gives up quickly and keeps being redelivered.
CLEANUP_LOCK_TIMEOUT_MS = 300
CLEANUP_MAX_UNFINISHED_DELIVERIES = 1000
# A second minutely policy, so a dead scheduler shows on a policy with nothing in flight.
RESERVATIONS_PURGE_SCHEDULE = "* * * * *"
# A shorter cadence for the hold test (tests/observability/test_alerts_live_halt.py): two
# slots a minute.
RESERVATIONS_EXPIRE_SCHEDULE = os.environ.get("E2E_EXPIRE_SCHEDULE", "* * * * *")
# E2E_SCHEDULER=0 runs a cluster whose workers take work and whose scheduler is dead.
Q_CLUSTER = {**Q_CLUSTER, "scheduler": os.environ.get("E2E_SCHEDULER", "1") != "0"}  # noqa: F405
