"""The engine's settings, read lazily from django.conf.settings under CLEANUP_*."""

from __future__ import annotations

import ipaddress
from datetime import timedelta
from functools import lru_cache

from django.conf import settings

DEFAULTS = {
    # A chunk whose deliveries keep starting without completing (its worker killed,
    # or transient errors outlasting the in-task retries) is dead-lettered when this
    # many earlier deliveries never completed.
    "MAX_UNFINISHED_DELIVERIES": 5,
    # Transient database errors retried inside one delivery before giving it back to
    # the broker, which only redelivers after its lease.
    "TRANSIENT_RETRIES": 3,
    # Base of the jittered exponential backoff between in-task retries, in seconds.
    "TRANSIENT_BACKOFF": 0.2,
    # PostgreSQL lock_timeout for a chunk's transaction, in milliseconds: a DELETE
    # stuck behind a long renewal gives up and is retried rather than hanging.
    "LOCK_TIMEOUT_MS": 5000,
    # A schedule slot with no run this long after it was due is a missed schedule.
    "SCHEDULE_GRACE_SECONDS": 120,
    # Who may read /metrics: clients in these networks, or any client sending
    # "Authorization: Bearer <METRICS_TOKEN>" when a token is set.
    "METRICS_ALLOWED_NETWORKS": ["127.0.0.0/8", "::1/128"],
    "METRICS_TOKEN": "",
    # A cluster whose workers have not run the (per-minute) heartbeat task for this
    # long is reported as not taking work.
    "HEARTBEAT_STALE_SECONDS": 180,
    # Finished runs and chunks older than this are purged by the engine's own
    # policies; so are django-q2's saved task results after TASK_RESULT_RETENTION_DAYS.
    "LEDGER_RETENTION_DAYS": 30,
    "TASK_RESULT_RETENTION_DAYS": 7,
    # Chunk size from a transaction-time budget: a new run's chunks hold as many rows
    # as recent chunks of the policy and scheme deleted in this many milliseconds
    # (0: always the policy's chunk_size). Bounded by the floor and the ceilings; an
    # items chunk carries each of its rows in its message, hence its lower ceiling.
    # 40 ms: at 50 the chunks' p99 reached 100 ms (README, Performance).
    "CHUNK_BUDGET_MS": 40,
    "MIN_ROWS_PER_CHUNK": 50,
    # Chunks of one policy in flight at once, for a policy that sets no window of its
    # own: its runs plan each next chunk as one ends. Above the worker count, so a
    # worker finishing a chunk finds the next one already queued.
    "WINDOW": 4,
    "MAX_ITEMS_PER_CHUNK": 2_000,
    "MAX_RANGE_ROWS_PER_CHUNK": 100_000,
}


class PrefixedSettings:
    """Attribute access to <PREFIX>_<NAME> in settings, falling back to defaults.

    Read on every access, so the pytest ``settings`` fixture and override_settings work.
    """

    def __init__(self, prefix: str, defaults: dict):
        self._prefix = prefix
        self._defaults = defaults

    def __getattr__(self, name: str):
        if name.startswith("_") or name not in self._defaults:
            raise AttributeError(name)
        return getattr(settings, f"{self._prefix}_{name}", self._defaults[name])


conf = PrefixedSettings("CLEANUP", DEFAULTS)


def metrics_networks() -> tuple:
    """The networks allowed to scrape /metrics, parsed once per value of the setting.

    Entries are stripped; one that is not a network is left out (and named by system
    check cleanup.E007), so a typo never turns a scrape into an error.
    """
    return parse_networks(_entries(conf.METRICS_ALLOWED_NETWORKS))[0]


def _entries(setting) -> tuple[str, ...]:
    if isinstance(setting, str):
        setting = setting.split(",")
    return tuple(str(entry).strip() for entry in setting if str(entry).strip())


@lru_cache(maxsize=16)
def parse_networks(entries: tuple[str, ...]) -> tuple[tuple, tuple[str, ...]]:
    """Return (networks, entries that are not networks); host bits count as a mistake."""
    networks, invalid = [], []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry))
        except ValueError:
            invalid.append(entry)
    return tuple(networks), tuple(invalid)


def invalid_metrics_networks() -> tuple[str, ...]:
    return parse_networks(_entries(conf.METRICS_ALLOWED_NETWORKS))[1]


def lease() -> timedelta:
    """How long a chunk may go without finishing before it counts as stalled: the
    broker's redelivery lease plus the task timeout."""
    q_cluster = getattr(settings, "Q_CLUSTER", {})
    return timedelta(seconds=q_cluster.get("retry", 60) + q_cluster.get("timeout", 0))
