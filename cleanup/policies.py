"""Cleanup policies: what the host project registers, and the registry that holds them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.apps import apps
from django.db import models
from django.db.models import Q

from cleanup.cutoffs import in_utc
from cleanup.exceptions import BadCutoff, BadScheme, UnknownPolicy

ITEMS = "items"
RANGE = "range"
SCHEMES = (ITEMS, RANGE)


@dataclass(frozen=True)
class Policy:
    """A named cleanup rule.

    ``eligible(cutoff=..., **derived)`` returns the whole eligibility predicate as a
    ``Q`` on the model's own columns (no relation lookups: the DELETE must carry it in
    its own WHERE). ``derive(cutoff)`` names the other instants the predicate needs (a
    retention deadline such as ``cutoff - retention``): they are computed once, at
    dispatch, and stored with the run, so no worker or replay reads a setting to decide
    eligibility. ``observed_field`` is the column whose planned value an items chunk
    carries and re-checks; ``partition_field`` splits range chunks (per tenant), and
    None makes them half-open id intervals over the whole table (a DELETE over one id
    interval then visits each heap page once, not once per tenant).
    ``window`` caps the policy's chunks in flight at once (its runs plan the next chunk
as one ends). ``schedule`` is a cron expression for django-q2, or None for manual
runs only.
    """

    name: str
    model_label: str
    eligible: Callable[[datetime], Q]
    observed_field: str
    partition_field: str | None
    scheme: str = ITEMS
    chunk_size: int = 500
    # Chunks in flight at most (the concurrency cap); None: CLEANUP_WINDOW.
    window: int | None = None
    schedule: str | None = None
    derive: Callable[[datetime], dict[str, datetime]] | None = None
    # Prefix of the per-item idempotency key logged at debug level,
    # "<prefix>:<pk>:<observed>"; None: the policy's name.
    idempotency_prefix: str | None = None
    # How long after its observed value a row becomes eligible (a retention period);
    # the backlog's age is measured from then.
    eligible_after: Callable[[], timedelta] | None = None
    # Called inside the chunk's transaction with exactly the rows its DELETE then
    # removes, locked (the ledger purge rolls up the counters of what it deletes).
    before_delete: Callable[[models.QuerySet], None] | None = None
    # The mutation: None deletes the eligible rows; a mapping of field to value (or
    # expression) updates them instead, and must move a row out of eligibility, so a
    # second delivery changes nothing (system check cleanup.E012).
    update: Mapping[str, Any] | None = None
    # A vacuum of the policy's table halts it (as GitLab's batched migrations do) rather
    # than only slowing it down: off by default, since a big cleanup sets off the
    # autovacuum of its own table and expired rows must still go on time.
    halt_on_vacuum: bool = False

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise BadScheme(f"policy {self.name!r}: scheme must be one of {SCHEMES}")
        if self.chunk_size < 1:
            raise ValueError(f"policy {self.name!r}: chunk_size must be positive")
        if self.window is not None and self.window < 1:
            raise ValueError(f"policy {self.name!r}: window must be positive")
        if self.update is not None and (not self.update or self.before_delete is not None):
            raise ValueError(f"policy {self.name!r}: update needs at least one assignment "
                             "and no before_delete hook")
        if self.idempotency_prefix is None:
            object.__setattr__(self, "idempotency_prefix", self.name)

    @property
    def mutation(self) -> str:
        """``delete`` or ``update``: what each chunk's single statement does."""
        return "delete" if self.update is None else "update"

    @property
    def model(self) -> type[models.Model]:
        return apps.get_model(self.model_label)

    @property
    def partition_column(self) -> str | None:
        """The attribute holding the partition's raw value (``tenant_id`` for an FK), or
        None when range chunks span the whole table."""
        if self.partition_field is None:
            return None
        return self.model._meta.get_field(self.partition_field).attname

    def freeze(self, cutoff: datetime) -> dict[str, datetime]:
        """Return the predicate's parameters at ``cutoff``: the cutoff and what it derives.

        Each derived instant is validated like the cutoff (aware, storable in UTC).
        """
        try:
            derived = self.derive(cutoff) if self.derive else {}
        except (OverflowError, ValueError) as exc:
            raise BadCutoff(
                f"cutoff {cutoff.isoformat()}: policy {self.name!r} cannot derive its "
                f"deadlines from it ({exc})"
            ) from None
        return {"cutoff": cutoff, **{
            name: in_utc(value, f"{self.name} {name}") for name, value in derived.items()
        }}

    def eligible_rows(self, frozen: dict[str, datetime]) -> models.QuerySet:
        """The rows eligible under frozen parameters (``freeze(cutoff)`` or a run's)."""
        return self.model._default_manager.filter(self.eligible(**frozen))

    @property
    def has_integer_key(self) -> bool:
        """Range chunks are half-open intervals of integer primary keys."""
        return isinstance(self.model._meta.pk, models.IntegerField)

    def eligible_since(self, observed: datetime) -> datetime:
        """When a row whose observed value is ``observed`` became eligible."""
        try:
            return observed + (self.eligible_after() if self.eligible_after else timedelta(0))
        except OverflowError:  # observed at the end of time (+infinity, read clamped)
            return datetime.max.replace(tzinfo=UTC)


_registry: dict[str, Policy] = {}
# (the policy replaced, the one that replaced it): system check cleanup.E043 names both,
# so which one runs never depends on the order apps load unseen.
_replaced: list[tuple[Policy, Policy]] = []


def register_policy(policy: Policy) -> Policy:
    """Register a policy under its name. Registering the same policy again is a no-op;
    another one of that name replaces it, and system check cleanup.E043 names the two
    (the rule of cleanup.outbox.register_handler). ``registered()`` replaces for a
    block."""
    current = _registry.get(policy.name)
    if current is not None and current != policy:
        _replaced.append((current, policy))
    _registry[policy.name] = policy
    return policy


def replaced() -> list[tuple[str, str, str]]:
    """Each name given a second, different policy: (name, the first, the second), each
    named by its eligibility callable and model."""
    return [(first.name, _described(first), _described(second))
            for first, second in _replaced]


def _described(policy: Policy) -> str:
    eligible = policy.eligible
    return (f"{getattr(eligible, '__module__', '?')}."
            f"{getattr(eligible, '__qualname__', eligible)} on {policy.model_label}")


@contextmanager
def registered(*policies: Policy):
    """Register policies for a block (a test's, say), then put the registry back as it
    was: names they replaced come back, new ones go."""
    saved, saved_replaced = dict(_registry), list(_replaced)
    try:
        for policy in policies:
            _registry[policy.name] = policy
        yield policies[0] if len(policies) == 1 else policies
    finally:
        _registry.clear()
        _registry.update(saved)
        _replaced[:] = saved_replaced


def get_policy(name: str) -> Policy:
    try:
        return _registry[name]
    except KeyError:
        raise UnknownPolicy(name, sorted(_registry)) from None


def find_policy(name: str) -> Policy | None:
    """The policy registered under ``name``, or None: one a deploy removed, named by a
    run or a task written before it."""
    return _registry.get(name)


def all_policies() -> list[Policy]:
    return [_registry[name] for name in sorted(_registry)]


def check_scheme(scheme: str | None, policy: Policy) -> str:
    """Return the scheme to use: the requested one, or the policy's default."""
    if scheme is None:
        scheme = policy.scheme
    elif scheme not in SCHEMES:
        raise BadScheme(f"unknown scheme {scheme!r} (use {' or '.join(SCHEMES)})")
    if scheme == RANGE and not policy.has_integer_key:
        pk = policy.model._meta.pk
        raise BadScheme(
            f"policy {policy.name!r} cannot use range chunks: {policy.model_label}.{pk.name} "
            f"is a {type(pk).__name__}, not an integer (use --scheme {ITEMS})"
        )
    return scheme
