"""A django-q2 qcluster of this project in a subprocess, for the commands that drive a
whole cycle (the demo, the bench, the soak): started, stopped, and found again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class QCluster:
    """One ``manage.py qcluster`` subprocess, in a session of its own (two hosts'
    worth means two of these)."""

    name: str
    env: dict
    manage: Path
    process: subprocess.Popen | None = None
    restarts: int = field(default=0)

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(self.manage), "qcluster"], env=self.env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM, as a deploy stops it; its whole session is killed if it outlasts
        ``timeout``."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
