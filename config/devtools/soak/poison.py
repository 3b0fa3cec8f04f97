"""A chunk that kills the worker applying it, on every delivery."""

from __future__ import annotations

import os
import signal
from datetime import datetime

from django.db.models import Q

from cleanup.policies import RANGE, Policy, register_policy

POISON_POLICY = "soak-poison"
POISON_CHANNEL = "soak-poison"


def poison_rows(cutoff: datetime) -> Q:
    return Q(channel=POISON_CHANNEL, sent_at__lte=cutoff)


def kill_this_worker(doomed) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def register_poison_policy() -> Policy:
    return register_policy(Policy(
        name=POISON_POLICY, model_label="reservations.ReminderAttempt", eligible=poison_rows,
        observed_field="sent_at", partition_field="tenant", scheme=RANGE,
        before_delete=kill_this_worker,
    ))
