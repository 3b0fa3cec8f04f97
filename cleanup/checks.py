"""System checks for the cleanup engine's settings, registered policies and handlers."""

from __future__ import annotations

import math

from django.core import checks
from django.db import DEFAULT_DB_ALIAS, router
from django.db.models.deletion import Collector
from django.utils import timezone

from cleanup.conf import conf
from cleanup.exceptions import CleanupError
from cleanup.observability.views import invalid_metrics_networks, metrics_networks
from cleanup.outbox import handlers
from cleanup.policies import RANGE, all_policies
from cleanup.policies import replaced as replaced_policies
from cleanup.rules import SETTING_RULES, SIZING_RULES, WINDOW_RULE, number


@checks.register(checks.Tags.database, checks.Tags.compatibility)
def check_queue_settings(app_configs=None, **kwargs):
    errors = []
    q_cluster = conf.q_cluster
    timeout, retry = q_cluster.timeout, q_cluster.retry
    if not timeout or timeout >= retry:
        errors.append(
            checks.Error(
                f"Q_CLUSTER retry ({retry}) must exceed timeout ({timeout}).",
                hint="Otherwise a chunk still running is handed out again and runs twice "
                "at once. Set timeout above the slowest chunk and retry above timeout.",
                id="cleanup.E001",
            )
        )
    if q_cluster.orm not in (None, DEFAULT_DB_ALIAS):
        errors.append(
            checks.Error(
                f"Q_CLUSTER orm is {q_cluster.orm!r}; it must be the models' alias "
                f"{DEFAULT_DB_ALIAS!r}.",
                hint="Runs, chunks and their messages commit in one transaction only on one "
                "alias, and schedules on another alias fire on every scheduler pass.",
                id="cleanup.E002",
            )
        )
    if q_cluster.catch_up:
        errors.append(
            checks.Warning(
                "Q_CLUSTER catch_up is on: after an outage one run is started per missed slot.",
                hint="Set 'catch_up': False; one late run covers the whole backlog.",
                id="cleanup.W001",
            )
        )
    return errors


@checks.register(checks.Tags.security)
def check_metrics_networks(app_configs=None, **kwargs):
    return [
        checks.Error(
            f"CLEANUP_METRICS_ALLOWED_NETWORKS has {entry!r}, which is not a network.",
            hint="Give CIDR networks such as 10.0.0.0/8 or 10.0.0.7/32 (no host bits set "
            "below the prefix). Scrapes from it are refused until it is fixed.",
            id="cleanup.E007",
        )
        for entry in invalid_metrics_networks()
    ]


@checks.register(checks.Tags.security, deploy=True)
def check_metrics_access(app_configs=None, **kwargs):
    if metrics_networks() or conf.METRICS_TOKEN:
        return []
    return [
        checks.Warning(
            "Nobody can scrape /metrics: neither CLEANUP_METRICS_ALLOWED_NETWORKS nor "
            "CLEANUP_METRICS_TOKEN is set.",
            hint="Allow the Prometheus servers' networks, or set a bearer token they send.",
            id="cleanup.W002",
        )
    ]


@checks.register()
def check_window(app_configs=None, **kwargs):
    return WINDOW_RULE.errors()


@checks.register()
def check_settings(app_configs=None, **kwargs):
    """Check the CLEANUP_* settings the checks above leave out, then the chunk-size
    bounds against each other and the retry budget."""
    errors = [error for rule in (*SETTING_RULES, *SIZING_RULES) for error in rule.errors()]
    return errors + _chunk_bound_errors() + _retry_budget_warnings()


def _chunk_bound_errors() -> list[checks.Error]:
    if any(rule.errors() for rule in SIZING_RULES):
        return []  # cleanup.E036 to E039 name them
    low, items_high, range_high = (
        conf.MIN_ROWS_PER_CHUNK, conf.MAX_ITEMS_PER_CHUNK, conf.MAX_RANGE_ROWS_PER_CHUNK
    )
    if low <= min(items_high, range_high):
        return []
    return [
        checks.Error(
            f"Chunk sizing is inconsistent: CLEANUP_CHUNK_BUDGET_MS={conf.CHUNK_BUDGET_MS}, "
            f"CLEANUP_MIN_ROWS_PER_CHUNK={low}, CLEANUP_MAX_ITEMS_PER_CHUNK={items_high}, "
            f"CLEANUP_MAX_RANGE_ROWS_PER_CHUNK={range_high}.",
            hint="The floor must be at most each ceiling: lower "
            "CLEANUP_MIN_ROWS_PER_CHUNK or raise the ceiling below it.",
            id="cleanup.E006",
        )
    ]


def _retry_budget_warnings() -> list[checks.Warning]:
    """A delivery's worst case of lock waits and backoff should end before the task
    timeout, or the worker is killed mid-retry and the delivery counts as unfinished.

    A warning, not an error: it is a worst case, and tests and drills run short task
    timeouts on purpose.
    """
    timeout = conf.q_cluster.timeout
    if not number(timeout) or timeout <= 0:
        return []  # cleanup.E001 names a missing or wrong timeout
    names = ("TRANSIENT_RETRIES", "TRANSIENT_BACKOFF", "LOCK_TIMEOUT_MS")
    if any(rule.errors() for rule in SETTING_RULES if rule.name in names):
        return []  # cleanup.E014 to E016 name them
    retries, backoff, lock_ms = (getattr(conf, name) for name in names)
    # Each attempt may wait out the lock timeout; retry n sleeps up to 1.5 * backoff *
    # 2**(n-1) (the jitter's top). Past 64 retries the sleeps alone outlast any timeout.
    worst = math.inf if retries > 64 else (
        (retries + 1) * lock_ms / 1000 + 1.5 * backoff * (2 ** retries - 1)
    )
    if worst < timeout:
        return []
    spent = "unbounded time" if math.isinf(worst) else f"{worst:,.1f} s"
    return [
        checks.Warning(
            f"One delivery of a chunk can spend {spent} waiting for locks and backing "
            f"off (CLEANUP_TRANSIENT_RETRIES={retries}, CLEANUP_TRANSIENT_BACKOFF={backoff}, "
            f"CLEANUP_LOCK_TIMEOUT_MS={lock_ms}), not less than the Q_CLUSTER timeout "
            f"({timeout} s).",
            hint="The worker would be killed before its retries end, and the delivery would "
            "count towards CLEANUP_MAX_UNFINISHED_DELIVERIES. Lower the retries, the backoff "
            "or the lock timeout, or raise the task timeout.",
            id="cleanup.W003",
        )
    ]


@checks.register(checks.Tags.models)
def check_policies(app_configs=None, **kwargs):
    errors = []
    for policy in all_policies():
        try:
            rows = policy.eligible_rows(policy.freeze(timezone.now()))
        except LookupError as exc:
            errors.append(
                checks.Error(
                    f"Policy {policy.name!r} names an unknown model: {exc}",
                    id="cleanup.E003",
                )
            )
            continue
        except (CleanupError, TypeError) as exc:
            errors.append(
                checks.Error(
                    f"Policy {policy.name!r} cannot build its predicate at the current time: "
                    f"{exc}",
                    hint="eligible() takes the cutoff and every name derive() returns, and "
                    "derive() must give instants PostgreSQL can store (check retention "
                    "settings).",
                    id="cleanup.E009",
                )
            )
            continue
        using = router.db_for_write(policy.model)
        if not Collector(using=using, origin=rows).can_fast_delete(rows):
            errors.append(
                checks.Error(
                    f"Policy {policy.name!r}: {policy.model_label} cannot be deleted in one "
                    "statement (it has delete signals or relations that cascade).",
                    hint="Django would SELECT the rows and DELETE them by pk, which deletes "
                    "a row renewed in between. Remove the signal receivers or the "
                    "CASCADE/SET_NULL foreign keys pointing at this model.",
                    obj=policy.model,
                    id="cleanup.E004",
                )
            )
        if policy.scheme == RANGE and not policy.has_integer_key:
            errors.append(
                checks.Error(
                    f"Policy {policy.name!r} uses range chunks, but the primary key of "
                    f"{policy.model_label} is a {type(policy.model._meta.pk).__name__}.",
                    hint="Range chunks are intervals of integer keys; use scheme='items'.",
                    obj=policy.model,
                    id="cleanup.E008",
                )
            )
        if (policy.partition_field is not None
                and policy.model._meta.get_field(policy.partition_field).null):
            errors.append(
                checks.Error(
                    f"Policy {policy.name!r} partitions its range chunks by "
                    f"{policy.partition_field!r}, which allows NULL.",
                    hint="Rows with a NULL partition would never be planned; partition by a "
                    "column that is never NULL, or by none (partition_field=None).",
                    obj=policy.model,
                    id="cleanup.E010",
                )
            )
        if policy.update is not None and not _moves_out(policy):
            errors.append(
                checks.Error(
                    f"Policy {policy.name!r} updates {sorted(policy.update)}, which does not "
                    "move a row out of its eligibility filter.",
                    hint="A second delivery would change the row again. Assign a field the "
                    "filter compares with another value (e.g. state='ready' where the "
                    "filter asks state='pending').",
                    obj=policy.model,
                    id="cleanup.E012",
                )
            )
        if len(rows.query.alias_map) > 1:
            errors.append(
                checks.Error(
                    f"Policy {policy.name!r}: its eligibility filter joins another table.",
                    hint="The DELETE would use WHERE pk IN (SELECT ...), which PostgreSQL "
                    "does not re-check against a row renewed concurrently. Filter on the "
                    "model's own columns only.",
                    obj=policy.model,
                    id="cleanup.E005",
                )
            )
    return errors


@checks.register()
def check_registrations(app_configs=None, **kwargs):
    """A name registered twice, with two different policies or handlers: the later one
    is in effect, and which one is later depends on the order apps load."""
    found = [f"Policy {name!r} is registered twice: {first}, then {second}."
             for name, first, second in replaced_policies()]
    found += [f"Event {name!r} has two handlers: {first}, then {second}."
              for name, first, second in handlers.replaced()]
    return [
        checks.Error(
            message,
            hint="Register one per name, once (a handler may call others). The one "
            "registered last is in effect, and which one that is depends on the order "
            "apps load. To replace one for a block of code (a test), use "
            "cleanup.policies.registered() or cleanup.outbox.registered().",
            id="cleanup.E043",
        )
        for message in found
    ]


def _moves_out(policy) -> bool:
    """Whether one of the update's constant assignments contradicts a condition every
    eligible row meets (an AND-ed exact, ``in`` or ``isnull`` lookup on that field)."""
    conditions = _required_conditions(policy.eligible(**policy.freeze(timezone.now())))
    for field, value in policy.update.items():
        if hasattr(value, "resolve_expression"):
            continue  # an expression's value is not known before it runs
        for name, lookup, wanted in conditions:
            if name != field:
                continue
            if (lookup == "exact" and wanted != value
                    or lookup == "in" and value not in wanted
                    or lookup == "isnull" and wanted != (value is None)):
                return True
    return False


def _required_conditions(q) -> list[tuple[str, str, object]]:
    """The (field, lookup, value) conditions of an AND-ed, non-negated Q tree."""
    if q.negated or q.connector != "AND":
        return []
    found = []
    for child in q.children:
        if isinstance(child, tuple):
            field, _, lookup = child[0].partition("__")
            found.append((field, lookup or "exact", child[1]))
        else:
            found += _required_conditions(child)
    return found
