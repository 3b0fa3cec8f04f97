"""The bench's and the soak's qcluster subprocesses, and finding their workers by
process title."""

from __future__ import annotations

from pathlib import Path

from cleanup.engine.transport import CHUNK_TASK
from cleanup.management import qcluster
from config.devtools import MANAGE


class Cluster(qcluster.QCluster):
    """A qcluster of the project's manage.py, whose workers can be found by title."""

    def __init__(self, name: str, env: dict):
        super().__init__(name, env, MANAGE)

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
