"""The engine's models: the ledger (cleanup.models.ledger) and what coordinates its
processes (cleanup.models.coordination)."""

from cleanup.expressions import MessageField  # migrations name it cleanup.models.MessageField
from cleanup.models.coordination import (
    BacklogReading,
    BlockedStep,
    Halt,
    Lease,
    WorkerHeartbeat,
)
from cleanup.models.ledger import (
    ROWS_CHANGED,
    Chunk,
    CleanupOverview,
    OrphanMessage,
    Run,
    ScheduleInstall,
    Slot,
    Total,
    rows_changed,
)
from cleanup.models.outbox import Event

__all__ = [
    "ROWS_CHANGED", "BacklogReading", "BlockedStep", "Chunk", "CleanupOverview", "Event",
    "Halt", "Lease", "MessageField", "OrphanMessage", "Run", "ScheduleInstall", "Slot",
    "Total", "WorkerHeartbeat", "rows_changed",
]
