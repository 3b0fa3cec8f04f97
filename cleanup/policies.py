"""Cleanup policies: what the host project registers, and the registry that holds them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.apps import apps
from django.db import models
from django.db.models import Q

from cleanup.exceptions import BadScheme, UnknownPolicy

ITEMS = "items"
RANGE = "range"
SCHEMES = (ITEMS, RANGE)


@dataclass(frozen=True)
class Policy:
    """A named cleanup rule.

    ``eligible(cutoff)`` returns the whole eligibility predicate as a ``Q`` on the
    model's own columns (no relation lookups: the DELETE must carry it in its own
    WHERE). ``observed_field`` is the column whose planned value an items chunk
    carries and re-checks; ``partition_field`` splits range chunks (per tenant).
    ``schedule`` is a cron expression for django-q2, or None for manual runs only.
    """

    name: str
    model_label: str
    eligible: Callable[[datetime], Q]
    observed_field: str
    partition_field: str
    scheme: str = ITEMS
    chunk_size: int = 500
    schedule: str | None = None
    # Prefix of the per-item key logged at debug level: "<prefix>:<pk>:<observed>".
    key_prefix: str | None = None
    # How long after its observed value a row becomes eligible (a retention period);
    # the backlog's age is measured from then.
    eligible_after: Callable[[], timedelta] | None = None
    # Called with the chunk's DELETE queryset inside its transaction, just before the
    # delete (the ledger purge rolls up the counters of what it deletes).
    before_delete: Callable[[models.QuerySet], None] | None = None

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise BadScheme(f"policy {self.name!r}: scheme must be one of {SCHEMES}")
        if self.chunk_size < 1:
            raise ValueError(f"policy {self.name!r}: chunk_size must be positive")

    @property
    def idempotency_prefix(self) -> str:
        return self.key_prefix or self.name

    @property
    def model(self) -> type[models.Model]:
        return apps.get_model(self.model_label)

    @property
    def partition_column(self) -> str:
        """The attribute holding the partition's raw value (``tenant_id`` for an FK)."""
        return self.model._meta.get_field(self.partition_field).attname

    def eligible_rows(self, cutoff: datetime) -> models.QuerySet:
        return self.model._default_manager.filter(self.eligible(cutoff))

    def eligible_since(self, observed: datetime) -> datetime:
        """When a row whose observed value is ``observed`` became eligible."""
        return observed + (self.eligible_after() if self.eligible_after else timedelta(0))


_registry: dict[str, Policy] = {}


def register(policy: Policy) -> Policy:
    """Register a policy under its name; registering the same name again replaces it."""
    _registry[policy.name] = policy
    return policy


def get_policy(name: str) -> Policy:
    try:
        return _registry[name]
    except KeyError:
        raise UnknownPolicy(name, sorted(_registry)) from None


def all_policies() -> list[Policy]:
    return [_registry[name] for name in sorted(_registry)]


def check_scheme(scheme: str | None, policy: Policy) -> str:
    """Return the scheme to use: the requested one, or the policy's default."""
    if scheme is None:
        return policy.scheme
    if scheme not in SCHEMES:
        raise BadScheme(f"unknown scheme {scheme!r} (use {' or '.join(SCHEMES)})")
    return scheme
