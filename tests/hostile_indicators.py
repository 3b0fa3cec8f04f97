"""A host's pressure indicator that answers what a file says, so a test can turn a
running cluster's indicator hostile and back (tests/observability/test_cluster_indicators.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from cleanup.engine.pressure import Level, Signal

# What the file's word makes the indicator answer.
ANSWERS = {
    "ok": lambda: Signal(Level.OK, "host_busy", 0.0, 1.0, "the host is idle"),
    "none": lambda: None,
    "text": lambda: "HOLD",
    "plain-two": lambda: Signal(2, "host_busy", None, None, "the host says halt"),
    "long-reason": lambda: Signal(Level.HALT, "r" * 200, None, None, "a reason of 200 chars"),
    "nul-detail": lambda: Signal(Level.HALT, "host_busy", None, None, "one\x00two"),
    "slow": lambda: (time.sleep(3), Signal(Level.OK, "host_busy", None, None, "slow"))[1],
}


def answer(policy, connection):
    return ANSWERS[Path(os.environ["HOSTILE_ANSWER_FILE"]).read_text().strip()]()
