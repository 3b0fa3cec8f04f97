"""The engine's models: the ledger (cleanup.models.ledger) and what coordinates its
processes (cleanup.models.coordination)."""

from cleanup.expressions import MessageField  # migrations name it cleanup.models.MessageField
from cleanup.models.coordination import Halt, Lease, WorkerHeartbeat
from cleanup.models.ledger import (
    ROWS_CHANGED,
    Chunk,
    CleanupOverview,
    LedgerTotal,
    OrphanMessage,
    Run,
    ScheduleInstall,
    Slot,
    rows_changed,
)
from cleanup.models.outbox import Event, EventTotal

__all__ = [
    "ROWS_CHANGED", "Chunk", "CleanupOverview", "Event", "EventTotal", "Halt", "Lease",
    "LedgerTotal", "MessageField", "OrphanMessage", "Run", "ScheduleInstall", "Slot",
    "WorkerHeartbeat", "rows_changed",
]
