"""What earlier releases wrote and a newer one must still run, or refuse clearly: chunk
messages with the django-q2 envelopes they were queued in (``messages/``), the other
task the engine queues (``tasks/``), every dotted path a release queued a task under or
installed a schedule for (``task_paths.json``) and every Schedule row it installed
(``schedules.json``).

``record.py`` wrote them from the git history; the tests read them and never change them.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
MESSAGES = HERE / "messages"


def recorded_message(name: str) -> dict:
    """One recorded message file (``v2-items``), as stored."""
    return json.loads((MESSAGES / f"{name}.json").read_text())


def recorded_message_names() -> list[str]:
    return sorted(path.stem for path in MESSAGES.glob("*.json"))


def task_paths() -> dict:
    return json.loads((HERE / "task_paths.json").read_text())
