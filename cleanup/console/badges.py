"""The states the console's badges know, and the labels it gives them where the choice's
own label does not fit a list."""

from __future__ import annotations

from cleanup import display
from cleanup.models import Chunk, Run

# Each run and chunk state's badge class; its colour is in cleanup/static/cleanup/console.css
# (tests/console/test_console_lists.py checks every class has a rule there).
STATE_COLOURS = {
    "planned": "state-planned", "enqueued": "state-enqueued", "retrying": "state-retrying",
    "committed": "state-committed", "acknowledged": "state-acknowledged",
    "dead_lettered": "state-dead-lettered", "discarded": "state-discarded",
    "cancelled": "state-cancelled", "running": "state-running", "completed": "state-completed",
    "completed_with_dead_letters": "state-completed-with-dead-letters",
}
SLOT_OUTCOMES = {"fired": "fired, not dispatched", "started": "started a run",
                 "coalesced": "coalesced"}

# Labels short enough for the runs list; the full one is the badge's title.
SHORT_RUN_STATES = {"completed_with_dead_letters": "Dead letters"}


def state_badge(row: Run | Chunk, label: str | None = None, title: str = ""):
    """A run's or a chunk's state; one written by hand past the choices shows as unknown."""
    return display.badge(row.state, label or row.get_state_display(), title,
                         known=STATE_COLOURS)
