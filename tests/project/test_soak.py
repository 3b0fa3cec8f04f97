"""Short soaks in CI: two real clusters, live traffic, real faults, with each broker.

transaction=True: the soak runs as a subprocess against the test database and its
clusters must see what it commits. `manage.py cleanup_soak --duration 600` is the
long form (docs/reliability.md).
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections import Counter

import pytest
import redis

from config.devtools.soak import faults, publishers, runner
from tests.conftest import ROOT, subprocess_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.soak]


def soak(**env: str) -> dict:
    result = subprocess.run(
        [sys.executable, "manage.py", "cleanup_soak", "--duration", "30", "--min-faults", "1",
         "--json", "--noinput"],
        cwd=ROOT, env=subprocess_env(**env), capture_output=True, text=True, timeout=420,
    )
    assert result.stdout, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    failed = [name for name, ok in report["checks"].items() if not ok]
    assert failed == [], json.dumps(report, indent=2)
    assert result.returncode == 0
    return report


def test_short_soak_with_the_orm_broker():
    report = soak()
    assert report["broker"] == "orm"
    figures = report["figures"]
    # --duration 30, and at most as long again while a fault kind is short of its hits
    # (each turn of the loop sleeps up to 2 s).
    assert 30 <= figures["soaked_seconds"] <= 64
    assert figures["renewed_or_confirmed_then_deleted"] == 0
    assert figures["holds_deleted_ledger"] == figures["holds_actually_gone"] > 0
    assert report["traffic"]["renewed"] > 0 and report["traffic"]["confirmed"] > 0
    reminders = figures["reminders"]
    assert reminders["marked_ledger"] > 0 and reminders["sent_while_soaking"] > 0
    assert reminders["renewed_while_falling_due"] > 0
    waitlist = figures["waitlist"]
    assert waitlist["events_by_state"] == {"delivered": waitlist["events_written"]}
    assert waitlist["events_by_source"]["chunks"] > 0
    assert waitlist["events_by_source"]["learners"] > 0
    assert sum(waitlist["freed_seats"].values()) == waitlist["events_written"]
    assert waitlist["freed_seats"]["offered"] == waitlist["offers"]["made"] == waitlist["mails"]
    assert waitlist["offers"]["confirmed"] > 0 and waitlist["offers"]["lapsed"] > 0
    assert waitlist["most_seats_beyond_capacity"] == 0
    assert waitlist["learners_waiting_beside_a_free_seat"] == 0
    publishers = waitlist["publishers"]
    assert publishers["faults"]["sigkill_worker_mid_publish"] > 0
    assert publishers["faults"]["terminate_publisher_backend"] > 0
    assert publishers["in_clusters"]["delivered"] > 0


@pytest.mark.pooler
def test_short_soak_with_one_cluster_behind_a_transaction_pooler():
    """host-b's cluster connects through a real PgBouncer in transaction mode (a small
    pool, other clients churning through it), host-a's directly: SIGKILLed workers,
    terminated connections and restarts lose nothing, and no session-level lock is left
    on a pooled server connection."""
    from django.db import connection

    from tests.pooler import Churn, pooler_advisory_locks, session_level_locks, started

    name = connection.settings_dict["NAME"]
    with started(pool_size=4) as pooler, Churn(pooler, name, clients=4, max_seconds=600):
        report = soak(SOAK_POOLER_URL=pooler.url_for(name))
        direct = pooler.direct_url(name)
        assert pooler_advisory_locks(pooler, direct) == []
        assert session_level_locks(direct, name) == []
    figures = report["figures"]
    assert figures["host_b_database"] == "through a pooler"
    assert figures["clusters_beating"] == ["host-a", "host-b"]
    assert figures["renewed_or_confirmed_then_deleted"] == 0
    assert figures["holds_deleted_ledger"] == figures["holds_actually_gone"] > 0


def test_short_soak_with_the_redis_broker():
    url = "redis://127.0.0.1:6379/14"
    redis.from_url(url).flushdb()
    report = soak(Q_BROKER="redis", REDIS_URL=url)
    assert report["broker"] == "redis"
    assert report["figures"]["chunks_reconciled"] >= 1
    assert report["figures"]["reminders"]["sent_while_soaking"] > 0
    redis.from_url(url).flushdb()


def test_a_soak_goes_on_only_while_a_fault_kind_caught_in_flight_is_short():
    hits = Counter({kind: 2 for kind in (*faults.KINDS, *publishers.KINDS)})
    assert runner._short_of(hits, 2) == []
    hits[faults.TERMINATE_BACKEND] = 1
    hits[faults.CLUSTER_RESTART] = hits[faults.POISON] = 0  # the soak's own, once each
    assert runner._short_of(hits, 2) == [faults.TERMINATE_BACKEND]


def test_the_soak_runs_with_the_settings_of_its_clusters():
    """The soak's own process (learners, dispatches, the last sender run) and its
    clusters agree: with another reminder lead, the clusters' sender would set aside
    reminders the learners' renewals made due, or send ones not due yet."""
    clusters = importlib.import_module(runner.SOAK_SETTINGS)
    assert clusters.Q_CLUSTER["retry"] == runner.RETRY
    assert clusters.Q_CLUSTER["timeout"] == runner.TIMEOUT
    assert clusters.CLEANUP_MAX_UNFINISHED_DELIVERIES == runner.MAX_UNFINISHED
    assert clusters.RESERVATIONS_HOLD_MINUTES == runner.HOLD_MINUTES
    assert clusters.RESERVATIONS_REMINDER_LEAD_MINUTES == runner.REMINDER_LEAD_MINUTES
    assert clusters.RESERVATIONS_REMINDER_SEND_SECONDS == runner.REMINDER_SEND_SECONDS
    assert clusters.EMAIL_BACKEND == runner.EMAIL_BACKEND
    assert clusters.CLEANUP_EVENT_BACKOFF_SECONDS == runner.EVENT_BACKOFF_SECONDS
    assert clusters.CLEANUP_EVENT_BACKOFF_MAX_SECONDS == runner.EVENT_BACKOFF_MAX_SECONDS
