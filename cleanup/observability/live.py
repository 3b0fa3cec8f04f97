"""The overview's live view: queue depth per policy, the workers busy and the chunk
each applies, rows changed per minute over the last hour.

(Being built: item 6 of issue 33.)
"""

from __future__ import annotations


def live_view(now):
    """What the overview's live view shows, or None."""
    return None
