"""Which function handles each event name: the host registers them at start-up."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from cleanup.exceptions import CleanupError
from cleanup.models import Event

Handler = Callable[[Event], None]

_handlers: dict[str, Handler] = {}


class HandlerConflict(CleanupError):
    """A second, different handler for a name: which one runs must never depend on the
    order apps load."""


def register(name: str, handler: Handler | None = None):
    """Register ``handler`` for events called ``name``; without one, a decorator.

    The publisher calls ``handler(event)`` inside its transaction, which also marks the
    event delivered: write through the default connection and the two commit together.
    Registering the same function again is a no-op.
    """
    if handler is None:
        return lambda function: register(name, function)
    if not isinstance(name, str) or not name.strip():
        raise CleanupError(f"an event name must be a non-empty string, not {name!r}")
    current = _handlers.get(name)
    if current is not None and current is not handler:
        raise HandlerConflict(f"event {name!r} already has a handler: {_named(current)}")
    _handlers[name] = handler
    return handler


def handler_for(name: str) -> Handler | None:
    return _handlers.get(name)


def names() -> list[str]:
    return sorted(_handlers)


@contextmanager
def registered(**handlers: Handler) -> Iterator[None]:
    """Register handlers for a block (a test's), then put the registry back as it was.

    Names that are not identifiers go through a dict: ``registered(**{"seat.freed": f})``.
    """
    saved = dict(_handlers)
    try:
        for name, handler in handlers.items():
            _handlers[name] = handler
        yield
    finally:
        _handlers.clear()
        _handlers.update(saved)


def _named(handler: Handler) -> str:
    return f"{getattr(handler, '__module__', '?')}.{getattr(handler, '__qualname__', handler)}"
