"""Replay-safe scheduled cleanup for Django on PostgreSQL: what a host project imports.

Everything a host needs is importable from here, ``from cleanup import Policy,
register_policy``; the modules below ``cleanup`` are the engine's own and may move.
Names are resolved when first used (PEP 562), so importing ``cleanup`` before the app
registry is ready (a settings module, an ``AppConfig``) loads no model.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

# Public name: (module, attribute in it), or (module, None) for the module itself.
_SURFACE: dict[str, tuple[str, str | None]] = {
    # Policies: what to clean and how.
    "Policy": ("cleanup.policies", "Policy"),
    "ITEMS": ("cleanup.policies", "ITEMS"),
    "RANGE": ("cleanup.policies", "RANGE"),
    "register_policy": ("cleanup.policies", "register"),
    "get_policy": ("cleanup.policies", "get_policy"),
    # Every refusal of the engine's (a policy unknown, a cutoff in the future, ...).
    "CleanupError": ("cleanup.exceptions", "CleanupError"),
    # Running work from code: what the cleanup_dispatch and cleanup_replay commands do.
    "preview_dispatch": ("cleanup.engine.dispatch", "preview_dispatch"),
    "dispatch": ("cleanup.engine.dispatch", "dispatch"),
    "dispatch_in_process": ("cleanup.engine.dispatch", "dispatch_in_process"),
    "replay": ("cleanup.engine.replay", "replay"),
    "run_summary": ("cleanup.observability.status", "run_summary"),
    "Run": ("cleanup.models", "Run"),
    "Chunk": ("cleanup.models", "Chunk"),
    # A host's own pressure indicators (CLEANUP_PRESSURE_INDICATORS) answer with these.
    "Signal": ("cleanup.engine.pressure", "Signal"),
    "Level": ("cleanup.engine.pressure", "Level"),
    # A host's own periodic tasks, installed with the policies' schedules.
    "register_task": ("cleanup.scheduling.schedules", "register_task"),
    "schedule_period": ("cleanup.scheduling.slots", "period"),
    # The outbox: events written with the change, delivered once.
    "Event": ("cleanup.models", "Event"),
    "emit": ("cleanup.outbox", "emit"),
    "BadEvent": ("cleanup.outbox", "BadEvent"),  # what emit() refuses, before any SQL
    "register_handler": ("cleanup.outbox", "register"),
    "publish": ("cleanup.outbox", "publish"),
    "events_on_delete": ("cleanup.outbox.triggers", "events_on_delete"),
    # For a host's own commands, pages and metrics, in the engine's manner.
    "engine_settings": ("cleanup.conf", "conf"),
    "CleanupCommand": ("cleanup.management.base", "CleanupCommand"),
    "WholeNumber": ("cleanup.management.base", "WholeNumber"),
    "MAX_INTEGER": ("cleanup.management.base", "MAX_INTEGER"),
    "Duration": ("cleanup.management.base", "Duration"),
    "count": ("cleanup.management.base", "count"),
    "ask": ("cleanup.management.base", "ask"),
    "progress": ("cleanup.management.reports", "progress"),
    "write_report": ("cleanup.management.reports", "write_report"),
    "QCluster": ("cleanup.management.qcluster", "Cluster"),
    "Budget": ("cleanup.observability.backlog", "Budget"),
    "read_backlog": ("cleanup.observability.backlog", "read_backlog"),
    "BACKLOG_COUNT_CAP": ("cleanup.observability.backlog", "COUNT_CAP"),
    "ConsoleAdmin": ("cleanup.console.base", "ConsoleAdmin"),
    "display": ("cleanup.display", None),
}

__all__ = sorted(_SURFACE)


def __getattr__(name: str) -> Any:
    try:
        module, attribute = _SURFACE[name]
    except KeyError:
        raise AttributeError(f"module 'cleanup' has no attribute {name!r}") from None
    found = import_module(module)
    return found if attribute is None else getattr(found, attribute)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
