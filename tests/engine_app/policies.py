"""The test app's cleanup policies, registered with the engine at start-up.

Between them they use each feature a policy has: both schemes, whole-table and
partitioned ranges, a before_delete hook, derived deadlines with eligible_after, a key
prefix, and an update instead of a delete.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Q, QuerySet
from django.db.models.functions import Now

from cleanup.policies import ITEMS, RANGE, Policy, register_policy
from tests.engine_app.conf import conf
from tests.engine_app.models import LeaseLog

EXPIRE_LEASES = "expire-leases"
EXPIRE_LEASES_RANGE = "expire-leases-range"
PURGE_LEASE_LOGS = "purge-lease-logs"
FLAG_LEASES = "flag-leases"


def expired_leases(cutoff: datetime) -> Q:
    return Q(state="active", expires_at__lte=cutoff)


def log_expiries(rows: QuerySet) -> None:
    """Record each lease the chunk's DELETE is about to remove (and no other)."""
    LeaseLog.objects.bulk_create(LeaseLog(account_id=account, lease_id=pk)
                                 for pk, account in rows.values_list("pk", "account_id"))


def log_retention() -> timedelta:
    return timedelta(days=conf.LOG_RETENTION_DAYS)


def log_deadline(cutoff: datetime) -> dict[str, datetime]:
    return {"recorded_before": cutoff - log_retention()}


def stale_logs(cutoff: datetime, recorded_before: datetime) -> Q:
    return Q(recorded_at__lte=recorded_before)


def unflagged_leases(cutoff: datetime) -> Q:
    return Q(state="active", notice="pending", expires_at__lte=cutoff)


def register_policies() -> None:
    register_policy(Policy(
        name=EXPIRE_LEASES,
        model_label="engine_app.Lease",
        eligible=expired_leases,
        observed_field="expires_at",
        partition_field=None,
        scheme=ITEMS,
        chunk_size=conf.EXPIRE_CHUNK_SIZE,
        idempotency_prefix="lease",
    ))
    register_policy(Policy(
        name=EXPIRE_LEASES_RANGE,
        model_label="engine_app.Lease",
        eligible=expired_leases,
        observed_field="expires_at",
        partition_field="account",
        scheme=RANGE,
        chunk_size=conf.EXPIRE_CHUNK_SIZE,
        before_delete=log_expiries,
    ))
    register_policy(Policy(
        name=PURGE_LEASE_LOGS,
        model_label="engine_app.LeaseLog",
        eligible=stale_logs,
        derive=log_deadline,
        observed_field="recorded_at",
        partition_field="account",
        scheme=RANGE,
        chunk_size=conf.PURGE_CHUNK_SIZE,
        eligible_after=log_retention,
    ))
    register_policy(Policy(
        name=FLAG_LEASES,
        model_label="engine_app.Lease",
        eligible=unflagged_leases,
        observed_field="expires_at",
        partition_field=None,
        scheme=ITEMS,
        chunk_size=conf.FLAG_CHUNK_SIZE,
        update={"notice": "due", "noticed_at": Now()},
    ))
