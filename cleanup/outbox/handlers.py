"""Which function handles each event name: the host registers them at start-up."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from cleanup.exceptions import CleanupError
from cleanup.models import Event
from cleanup.outbox.emitting import event_name

Handler = Callable[[Event], None]

_handlers: dict[str, Handler] = {}
# (name, the handler replaced, the one that replaced it): system check cleanup.E043
# names both, so which one runs never depends on the order apps load unseen.
_replaced: list[tuple[str, Handler, Handler]] = []


def register_handler(name: str, handler: Handler | None = None):
    """Register ``handler`` for events called ``name``; without one, a decorator.

    The publisher calls ``handler(event)`` inside its transaction, which also marks the
    event delivered: write through the default connection and the two commit together.
    Registering the same function again is a no-op; another one replaces it, as a policy
    registered again does, and system check cleanup.E043 names the two.
    """
    if handler is None:
        return lambda function: register_handler(name, function)
    event_name(name)
    if not callable(handler):
        raise CleanupError(f"the handler of event {name!r} must be callable, not "
                           f"{handler!r:.60}")
    current = _handlers.get(name)
    if current is not None and current is not handler:
        _replaced.append((name, current, handler))
    _handlers[name] = handler
    return handler


def replaced() -> list[tuple[str, str, str]]:
    """Each name given a second, different handler: (name, the first, the second)."""
    return [(name, named(first), named(second)) for name, first, second in _replaced]


def handler_for(name: str) -> Handler | None:
    return _handlers.get(name)


def names() -> list[str]:
    return sorted(_handlers)


@contextmanager
def registered(**handlers: Handler) -> Iterator[None]:
    """Register handlers for a block (a test's), then put the registry back as it was.

    Names that are not identifiers go through a dict: ``registered(**{"seat.freed": f})``.
    """
    saved, saved_replaced = dict(_handlers), list(_replaced)
    try:
        for name, handler in handlers.items():
            _handlers[name] = handler
        yield
    finally:
        _handlers.clear()
        _handlers.update(saved)
        _replaced[:] = saved_replaced


def named(handler: Handler) -> str:
    """A handler's dotted name: ``reservations.waitlist.offer_freed_seat``."""
    return f"{getattr(handler, '__module__', '?')}.{getattr(handler, '__qualname__', handler)}"
