"""One test per system check id."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from django.db.models import Q

from cleanup.checks import (
    check_metrics_access,
    check_metrics_networks,
    check_policies,
    check_queue_settings,
)
from cleanup.policies import get_policy, register


def ids(messages) -> list[str]:
    return [m.id for m in messages]


def test_shipped_settings_and_policies_pass_every_check():
    assert check_queue_settings() == []
    assert check_policies() == []
    assert check_metrics_networks() == []
    assert check_metrics_access() == []


def test_e001_retry_must_exceed_timeout(settings):
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "timeout": 60, "retry": 60}
    assert ids(check_queue_settings()) == ["cleanup.E001"]


def test_e002_queue_must_share_the_models_alias(settings):
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "orm": "queue"}
    assert ids(check_queue_settings()) == ["cleanup.E002"]


@pytest.mark.parametrize("bad", [
    {"CLEANUP_CHUNK_BUDGET_MS": -1},
    {"CLEANUP_MIN_ROWS_PER_CHUNK": 0},
    {"CLEANUP_MIN_ROWS_PER_CHUNK": 3_000, "CLEANUP_MAX_ITEMS_PER_CHUNK": 2_000},
])
def test_e006_chunk_sizing_bounds_must_be_consistent(settings, bad):
    for name, value in bad.items():
        setattr(settings, name, value)
    assert ids(check_queue_settings()) == ["cleanup.E006"]


def test_w001_catch_up_should_be_off(settings):
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "catch_up": True}
    assert ids(check_queue_settings()) == ["cleanup.W001"]


@pytest.fixture
def extra_policy(chunk_size):
    # chunk_size restores the registry afterwards.
    return lambda **changes: register(replace(get_policy("expire-holds"), **changes))


def test_e003_unknown_model(extra_policy):
    extra_policy(name="ghost", model_label="reservations.Ghost")
    assert ids(check_policies()) == ["cleanup.E003"]


def test_e004_model_that_cannot_be_fast_deleted(extra_policy):
    # Deleting a tenant cascades to its sections and holds: SELECT-then-DELETE.
    extra_policy(name="tenants", model_label="reservations.Tenant",
                 eligible=lambda cutoff: Q(name__startswith="gone"))
    assert ids(check_policies()) == ["cleanup.E004"]


def test_e005_eligibility_through_a_relation(extra_policy):
    extra_policy(name="joined", eligible=lambda cutoff: Q(section__title="x"))
    assert ids(check_policies()) == ["cleanup.E005"]


@pytest.mark.parametrize("entry", ["10.0.0.1/8", "not-a-network", "10.0.0.0/33"])
def test_e007_metrics_networks_must_be_networks(settings, entry):
    settings.CLEANUP_METRICS_ALLOWED_NETWORKS = ["127.0.0.0/8", entry]
    assert ids(check_metrics_networks()) == ["cleanup.E007"]


def test_metrics_networks_are_stripped_and_a_bad_one_never_fails_a_scrape(db, client, settings):
    settings.CLEANUP_METRICS_ALLOWED_NETWORKS = ["127.0.0.0/8", "10.0.0.1/8", " 192.168.0.0/16 "]
    assert check_metrics_networks()[0].msg.startswith(
        "CLEANUP_METRICS_ALLOWED_NETWORKS has '10.0.0.1/8'")
    assert client.get("/metrics", REMOTE_ADDR="192.168.4.5").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 403
    assert client.get("/metrics", REMOTE_ADDR="172.16.0.1").status_code == 403


def test_w002_deploy_warns_when_nobody_can_scrape_metrics(settings):
    settings.CLEANUP_METRICS_ALLOWED_NETWORKS = []
    settings.CLEANUP_METRICS_TOKEN = ""
    assert ids(check_metrics_access()) == ["cleanup.W002"]
    settings.CLEANUP_METRICS_TOKEN = "secret"
    assert check_metrics_access() == []


def test_e008_range_policy_needs_an_integer_key(extra_policy):
    extra_policy(name="runs-by-range", model_label="cleanup.Run", scheme="range",
                 eligible=lambda cutoff: Q(state="completed"))
    assert ids(check_policies()) == ["cleanup.E008"]


@pytest.mark.parametrize("changes", [
    {"derive": lambda cutoff: {"sent_before": cutoff}},  # eligible() does not take it
    {"derive": lambda cutoff: {"sent_before": cutoff - timedelta(days=999_999_999)}},
])
def test_e009_a_policy_must_build_its_predicate_now(extra_policy, changes):
    extra_policy(name="broken-deadline", **changes)
    assert ids(check_policies()) == ["cleanup.E009"]
