"""The transactional outbox: events recorded in the transaction of the change that
caused them (``emit``), delivered once each by a publisher (``publish``) that calls the
handler registered for the event's name and marks the event delivered in the handler's
own transaction. Dead events are requeued or discarded by an operator."""

from cleanup.outbox.emitting import BadEvent, OutsideTransaction, emit
from cleanup.outbox.handlers import register_handler, registered
from cleanup.outbox.operations import discard, requeue
from cleanup.outbox.publisher import PublishResult, publish

__all__ = [
    "BadEvent", "OutsideTransaction", "PublishResult", "discard", "emit", "publish",
    "register_handler", "registered", "requeue",
]
