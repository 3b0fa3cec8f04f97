"""Named points of a chunk's transaction where a test injects a failure.

``reach(point)`` is a no-op unless a fault is injected there; ``injected`` installs one
for a block. Tests use it instead of patching the engine's functions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

# Inside the chunk's transaction, before it locks the chunk's row.
BEFORE_CHUNK_LOCK = "before_chunk_lock"
# After the chunk's DELETE and its ledger write, before the transaction commits.
BEFORE_COMMIT = "before_commit"
POINTS = (BEFORE_CHUNK_LOCK, BEFORE_COMMIT)

_injected: dict[str, list[Callable[[], None]]] = {}


def reach(point: str) -> None:
    """Run the faults injected at ``point`` (they raise, or record and pass)."""
    for fault in _injected.get(point, ()):
        fault()


@contextmanager
def injected(point: str, fault: Callable[[], None]) -> Iterator[None]:
    """Inject ``fault`` at ``point`` for the block."""
    if point not in POINTS:
        raise ValueError(f"unknown fault point {point!r} (known: {POINTS})")
    _injected.setdefault(point, []).append(fault)
    try:
        yield
    finally:
        _injected[point].remove(fault)
