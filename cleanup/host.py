"""Helpers for a host's own commands, pages and metrics, made in the engine's manner:
``from cleanup.host import CleanupCommand, count``.

Like ``cleanup``'s, each name is resolved when first used (PEP 562), so importing this
module loads no model.
"""

from __future__ import annotations

from cleanup import _lazy_names

# Public name: (module, attribute in it), or (module, None) for the module itself.
_SURFACE: dict[str, tuple[str, str | None]] = {
    # The engine's settings (CLEANUP_*), as its own code reads them.
    "conf": ("cleanup.conf", "conf"),
    # Commands: a base that reports errors met on the way, and its argument types.
    "CleanupCommand": ("cleanup.management.base", "CleanupCommand"),
    "WholeNumber": ("cleanup.management.base", "WholeNumber"),
    "MAX_INTEGER": ("cleanup.management.base", "MAX_INTEGER"),
    "Duration": ("cleanup.management.base", "Duration"),
    "count": ("cleanup.management.base", "count"),
    "ask": ("cleanup.management.base", "ask"),
    "progress": ("cleanup.management.reports", "progress"),
    "quiet_logs": ("cleanup.management.base", "quiet_logs"),
    "write_report": ("cleanup.management.reports", "write_report"),
    "QCluster": ("cleanup.management.qcluster", "QCluster"),
    # Metrics: a backlog read within a time budget, counted up to a cap.
    "Budget": ("cleanup.observability.backlog", "Budget"),
    "read_backlog": ("cleanup.observability.backlog", "read_backlog"),
    "COUNT_CAP": ("cleanup.observability.backlog", "COUNT_CAP"),
    # Pages: the console's admin base and its one format for cells.
    "ConsoleAdmin": ("cleanup.console.base", "ConsoleAdmin"),
    "display": ("cleanup.display", None),
}

__all__ = sorted(_SURFACE)

__getattr__, __dir__ = _lazy_names(__name__, _SURFACE, globals())
