"""Replay-safe scheduled cleanup for Django on PostgreSQL: what a host project imports.

The engine is imported from here, ``from cleanup import Policy, register_policy``, and
the helpers for a host's own commands, pages and metrics from ``cleanup.host``; the
other modules below ``cleanup`` are the engine's own and may move. Names are resolved
when first used (PEP 562), so importing ``cleanup`` before the app registry is ready (a
settings module, an ``AppConfig``) loads no model.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any

# Public name: (module, attribute in it), or (module, None) for the module itself.
_SURFACE: dict[str, tuple[str, str | None]] = {
    # Policies: what to clean and how.
    "Policy": ("cleanup.policies", "Policy"),
    "ITEMS": ("cleanup.policies", "ITEMS"),
    "RANGE": ("cleanup.policies", "RANGE"),
    "register_policy": ("cleanup.policies", "register_policy"),
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
    "schedule_period": ("cleanup.scheduling.slots", "schedule_period"),
    # The outbox: events written with the change, delivered once.
    "Event": ("cleanup.models", "Event"),
    "emit": ("cleanup.outbox", "emit"),
    "BadEvent": ("cleanup.outbox", "BadEvent"),  # what emit() refuses, before any SQL
    "register_handler": ("cleanup.outbox", "register_handler"),
    "publish": ("cleanup.outbox", "publish"),
    "events_on_delete": ("cleanup.outbox.triggers", "events_on_delete"),
}

__all__ = sorted(_SURFACE)


def _lazy_names(
    module_name: str, surface: dict[str, tuple[str, str | None]], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of a module whose public names are ``surface``:
    each imported from where it lives when first used."""

    def getattr_(name: str) -> Any:
        try:
            module, attribute = surface[name]
        except KeyError:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}") from None
        found = import_module(module)
        return found if attribute is None else getattr(found, attribute)

    def dir_() -> list[str]:
        return sorted({*namespace, *surface})

    return getattr_, dir_


__getattr__, __dir__ = _lazy_names(__name__, _SURFACE, globals())
