"""/metrics: figures from the ledger, right across processes, and restricted."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
from datetime import timedelta
from io import StringIO
from logging.config import dictConfig

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from cleanup.console.badges import STATE_COLOURS
from cleanup.engine.dispatch import dispatch, dispatch_in_process
from cleanup.engine.worker import apply_chunk
from cleanup.models import Chunk, ScheduleInstall
from cleanup.scheduling.schedules import install_schedules
from config.logs import logging_config
from tests.conftest import ROOT, wait_for
from tests.engine.test_processes import qcluster  # noqa: F401  (fixture)
from tests.engine_app.factories import LeaseFactory, LeaseLogFactory
from tests.engine_app.services import renew_lease

pytestmark = pytest.mark.django_db
LEASES = {"policy": "expire-leases"}


def scrape(client, **headers) -> dict:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[sample.name, frozenset(sample.labels.items())] = sample.value
    return samples


def value(samples: dict, name: str, **labels) -> float:
    return samples[name, frozenset(labels.items())]


def delta(before: dict, after: dict, name: str, **labels) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def test_counters_move_by_what_a_known_run_did(client, expired_leases):
    before = scrape(client)
    chunk = dispatch("expire-leases").run.chunks.get()
    renew_lease(expired_leases[0].pk)
    apply_chunk(chunk.message)
    apply_chunk(chunk.message)  # a duplicate: a no-op
    after = scrape(client)

    expected = {
        "cleanup_candidates_found_total": 5,
        "cleanup_chunks_published_total": 1,
        "cleanup_deliveries_total": 2,
        "cleanup_rows_deleted_total": 4,
        "cleanup_noop_total": 1,
        "cleanup_items_skipped_total": 1,
        "cleanup_chunks_committed_total": 1,
        "cleanup_chunk_rows_count": 1,
        "cleanup_chunk_rows_sum": 4,
        "cleanup_chunk_transaction_seconds_count": 1,
    }
    assert {name: delta(before, after, name, **LEASES) for name in expected} == expected
    assert delta(before, after, "cleanup_runs_total", trigger="command", **LEASES) == 1
    assert delta(before, after, "cleanup_chunk_rows_bucket", le="1.0", **LEASES) == 0
    assert delta(before, after, "cleanup_chunk_rows_bucket", le="10.0", **LEASES) == 1
    assert value(after, "cleanup_chunks_awaiting_ack", **LEASES) == 1
    assert value(after, "cleanup_chunks", state="committed", **LEASES) == 1


def test_failures_and_dead_letters_are_counted_apart(client, expired_leases):
    before = scrape(client)
    chunk = dispatch("expire-leases").run.chunks.get()
    apply_chunk({**chunk.message, "version": 9})
    apply_chunk("garbage")
    after = scrape(client)

    assert delta(before, after, "cleanup_dead_lettered_total", **LEASES) == 1
    assert delta(before, after, "cleanup_dead_lettered_total", policy="unknown") == 1
    assert delta(before, after, "cleanup_retryable_failures_total", **LEASES) == 0
    assert value(after, "cleanup_chunks", state="dead_lettered", **LEASES) == 1


def test_backlog_gauges_read_the_eligible_rows(client, account):
    assert value(scrape(client), "cleanup_eligible_rows", **LEASES) == 0
    LeaseFactory(account=account, expires_at=timezone.now() - timedelta(hours=2))
    samples = scrape(client)
    assert value(samples, "cleanup_oldest_eligible_age_seconds", **LEASES) >= 7200
    assert value(samples, "cleanup_eligible_rows", **LEASES) >= 1


def test_schedule_lag_counts_from_the_first_slot_the_scheduler_did_not_fire(
        client, expire_leases_scheduled):
    install_schedules()
    assert value(scrape(client), "cleanup_schedule_lag_seconds", **LEASES) == 0  # fresh

    sixteen_minutes_ago = timezone.now() - timedelta(minutes=16)
    ScheduleInstall.objects.update(installed_at=sixteen_minutes_ago)
    lag = value(scrape(client), "cleanup_schedule_lag_seconds", **LEASES)
    first_missed = sixteen_minutes_ago.replace(second=0, microsecond=0) + timedelta(minutes=1)
    assert lag == pytest.approx((timezone.now() - first_missed).total_seconds(), abs=2)
    assert lag > 15 * 60 - 2


def test_every_chunk_state_has_a_metric_and_an_admin_label(client):
    samples = scrape(client)
    for state in Chunk.State.values:
        assert ("cleanup_chunks", frozenset({**LEASES, "state": state}.items())) in samples
        assert state in STATE_COLOURS


def test_metrics_refuse_clients_outside_the_allowed_networks(client, settings):
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 403
    settings.CLEANUP_METRICS_TOKEN = "s3cret"
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3",
                      HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3",
                      HTTP_AUTHORIZATION="Bearer s3cret").status_code == 200
    settings.CLEANUP_METRICS_ALLOWED_NETWORKS = []  # the production profile's default
    settings.CLEANUP_METRICS_TOKEN = ""
    assert client.get("/metrics").status_code == 403


def test_multiprocess_mode_still_serves_the_ledger_figures(client, monkeypatch, tmp_path,
                                                           expired_leases):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    dispatch_in_process("expire-leases")
    assert value(scrape(client), "cleanup_rows_deleted_total", **LEASES) == 5


@pytest.mark.django_db(transaction=True)  # the qcluster subprocess must see the commits
def test_figures_are_right_when_a_qcluster_process_does_the_work(client, qcluster):  # noqa: F811
    LeaseFactory.create_batch(4, expired=True)
    before = scrape(client)
    run = dispatch("expire-leases").run
    qcluster()
    wait_for(lambda: not Chunk.objects.filter(run=run).exclude(state="acknowledged").exists(),
             timeout=60, what="the chunk to be acknowledged")

    after = scrape(client)

    assert delta(before, after, "cleanup_rows_deleted_total", **LEASES) == 4
    assert delta(before, after, "cleanup_deliveries_total", **LEASES) == 1
    assert value(after, "cleanup_chunks", state="acknowledged", **LEASES) == 1
    assert value(after, "cleanup_chunks_awaiting_ack", **LEASES) == 0


# The alert rules and the dashboard the project deploys: the engine's series and the
# product's, each pinned by its own tests (tests/product/test_product_metrics.py).
DEPLOYED = ("deploy/prometheus/cleanup-alerts.yml", "deploy/grafana/cleanup-dashboard.json")


def families_served(client, prefix: str) -> list[str]:
    """The names of the metric families /metrics declares under ``prefix``, repeats kept."""
    return [family.name for family in text_string_to_metric_families(
        client.get("/metrics").content.decode()) if family.name.startswith(f"{prefix}_")]


def series_deployed(prefix: str) -> set[str]:
    """The names under ``prefix`` that the deployed alert rules and dashboard read."""
    used = set()
    for path in DEPLOYED:
        used |= set(re.findall(rf"\b{prefix}_[a-z_]+", (ROOT / path).read_text()))
    return used


# The series a family without samples would have (cleanup_chunk_wal_bytes before
# PostgreSQL 18: declared, never sampled), by its type.
SERIES_OF = {"counter": ("_total",), "summary": ("_sum", "_count"),
             "histogram": ("_bucket", "_sum", "_count")}


def test_each_metric_is_declared_once_and_alerts_use_only_real_series(client):
    families = families_served(client, "cleanup")
    assert len(families) == len(set(families))
    declared = {family.name + suffix for family in text_string_to_metric_families(
        client.get("/metrics").content.decode()) if family.name.startswith("cleanup_")
        for suffix in SERIES_OF.get(family.type, ("",))}
    names = {n for (n, _) in scrape(client)} | set(families) | declared
    used = series_deployed("cleanup")
    assert "cleanup_rows_changed_total" in used
    assert used - names == set()


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None and os.environ.get("CI") != "true",
                    reason="promtool not installed (apt-get install prometheus)")
def test_alert_rules_are_valid_and_their_unit_tests_pass():
    assert PROMTOOL, "CI must install promtool (Debian package prometheus)"
    folder = ROOT / "deploy" / "prometheus"
    for args in (["check", "rules", "cleanup-alerts.yml"],
                 ["test", "rules", "cleanup-alerts.test.yml"]):
        result = subprocess.run([PROMTOOL, *args], cwd=folder, capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "SUCCESS" in result.stdout


def test_dashboard_is_valid_json_with_a_panel_per_series():
    dashboard = json.loads((ROOT / "deploy/grafana/cleanup-dashboard.json").read_text())
    assert dashboard["uid"] == "seat-hold-cleanup"
    assert len(dashboard["panels"]) >= 10


def test_json_log_lines_carry_the_ids(expired_leases):
    stream = StringIO()
    config = logging_config(json_lines=True)
    config["handlers"]["console"]["stream"] = stream
    dictConfig(config)
    try:
        chunk = dispatch("expire-leases").run.chunks.get()
        apply_chunk(chunk.message)
    finally:
        from django.conf import settings

        dictConfig(settings.LOGGING)
        logging.getLogger("cleanup").setLevel(logging.INFO)
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    outcome = next(e for e in events if e["event"] == "chunk outcome")
    assert (outcome["run_id"], outcome["chunk_id"], outcome["outcome"]) == (
        str(chunk.run_id), 1, "deleted")
    assert outcome["policy"] == "expire-leases" and outcome["rows_deleted"] == 5
    dispatched = next(e for e in events if e["event"] == "dispatched")
    assert dispatched["dispatch_key"].startswith("command:")


def test_an_update_policy_counts_rows_updated_and_changed_and_no_rows_deleted(client, account):
    LeaseFactory.create_batch(3, account=account, expired=True)  # each one's notice due
    before = scrape(client)
    dispatch_in_process("flag-leases")
    after = scrape(client)
    flags = {"policy": "flag-leases"}
    assert delta(before, after, "cleanup_rows_updated_total", **flags) == 3
    assert delta(before, after, "cleanup_rows_changed_total", **flags) == 3
    assert delta(before, after, "cleanup_rows_deleted_total", **flags) == 0
    assert delta(before, after, "cleanup_chunk_rows_sum", **flags) == 3
    # A delete policy's rows changed are its rows deleted (the logs': the flagged leases
    # are still expired, so expire-leases would take them too).
    LeaseLogFactory.create_batch(2, account=account, stale=True)
    dispatch_in_process("purge-lease-logs")
    later = scrape(client)
    purges = {"policy": "purge-lease-logs"}
    assert delta(after, later, "cleanup_rows_changed_total", **purges) == 2
    assert delta(after, later, "cleanup_rows_deleted_total", **purges) == 2

