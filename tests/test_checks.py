"""One test per system check id."""

from __future__ import annotations

from dataclasses import replace

import pytest
from django.db.models import Q

from cleanup.checks import check_policies, check_queue_settings
from cleanup.policies import get_policy, register


def ids(messages) -> list[str]:
    return [m.id for m in messages]


def test_shipped_settings_and_policies_pass_every_check():
    assert check_queue_settings() == []
    assert check_policies() == []


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
