"""The soak's qcluster subprocesses, and finding their workers by process title."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from cleanup.engine.transport import CHUNK_TASK
from config.devtools import MANAGE


@dataclass
class Cluster:
    """One `manage.py qcluster` subprocess: two hosts' worth means two of these."""

    name: str
    env: dict
    process: subprocess.Popen | None = None
    restarts: int = field(default=0)

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(MANAGE), "qcluster"], env=self.env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )

    def stop(self, timeout: float = 30) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def busy_workers(self) -> list[int]:
        """Pids of this cluster's workers that are applying a chunk right now."""
        if self.process is None:
            return []
        return [pid for pid in descendants(self.process.pid)
                if "processing" in title(pid) and CHUNK_TASK in title(pid)]


def title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found
