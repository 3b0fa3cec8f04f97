"""One test per system check id."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from datetime import timedelta

import pytest
from django.core import checks
from django.db.models import Q

from cleanup.checks import (
    check_metrics_access,
    check_metrics_networks,
    check_policies,
    check_queue_settings,
    check_settings,
    check_window,
)
from cleanup.conf import DEFAULTS, Settings, conf
from cleanup.policies import get_policy, register_policy
from tests.conftest import ROOT

# The checks that read CLEANUP_* settings, and the id that refuses each setting's type.
SETTING_CHECKS = (check_settings, check_window, check_metrics_networks, check_metrics_access)
CHECKED_BY = {
    "MAX_UNFINISHED_DELIVERIES": "cleanup.E013",
    "TRANSIENT_RETRIES": "cleanup.E014",
    "TRANSIENT_BACKOFF": "cleanup.E015",
    "LOCK_TIMEOUT_MS": "cleanup.E016",
    "SCHEDULE_GRACE_SECONDS": "cleanup.E017",
    "METRICS_ALLOWED_NETWORKS": "cleanup.E022",
    "METRICS_TOKEN": "cleanup.E021",
    "HEARTBEAT_STALE_SECONDS": "cleanup.E018",
    "LEDGER_RETENTION_DAYS": "cleanup.E019",
    "TASK_RESULT_RETENTION_DAYS": "cleanup.E020",
    "CHUNK_BUDGET_MS": "cleanup.E036",
    "MIN_ROWS_PER_CHUNK": "cleanup.E037",
    "WINDOW": "cleanup.E011",
    "MAX_ITEMS_PER_CHUNK": "cleanup.E038",
    "MAX_RANGE_ROWS_PER_CHUNK": "cleanup.E039",
    "MAX_REPLICA_LAG": "cleanup.E023",
    "MAX_LOCK_WAIT_MS": "cleanup.E024",
    "PRESSURE_CHECK_SECONDS": "cleanup.E025",
    "PRESSURE_INDICATORS": "cleanup.E026",
    "STATEMENT_TIMEOUT_MS": "cleanup.E027",
    "IDLE_IN_TRANSACTION_TIMEOUT_MS": "cleanup.E040",
    "SYNC_CLAIM_SECONDS": "cleanup.E028",
    "NODE_NAME": "cleanup.E029",
    "ROW_LOCK_WAIT_MS": "cleanup.E030",
    "FAILING_CHUNKS": "cleanup.E031",
    "EVENT_MAX_ATTEMPTS": "cleanup.E032",
    "EVENT_BACKOFF_SECONDS": "cleanup.E033",
    "EVENT_BACKOFF_MAX_SECONDS": "cleanup.E034",
    "EVENT_RETENTION_DAYS": "cleanup.E035",
    "EVENT_PAYLOAD_MAX_BYTES": "cleanup.E041",
    "EVENT_PAYLOAD_MAX_DEPTH": "cleanup.E042",
}


def ids(messages) -> list[str]:
    return [m.id for m in messages]


def test_shipped_settings_and_policies_pass_every_check():
    assert check_queue_settings() == []
    assert check_policies() == []
    assert check_metrics_networks() == []
    assert check_metrics_access() == []
    assert check_settings() == []
    assert check_window() == []


def test_every_setting_has_a_check_that_refuses_its_type():
    assert sorted(CHECKED_BY) == sorted(Settings.names())
    registered = checks.registry.registry.get_checks(include_deployment_checks=True)
    assert set(SETTING_CHECKS) <= set(registered)


@pytest.mark.parametrize("name", Settings.names())
def test_each_setting_reads_its_own_name_on_every_access(settings, name):
    delattr(settings, f"CLEANUP_{name}")  # some are set by conftest's autouse fixture
    assert getattr(conf, name) == DEFAULTS[name]
    marker = object()
    setattr(settings, f"CLEANUP_{name}", marker)
    assert getattr(conf, name) is marker


@pytest.mark.parametrize("wrong", [True, b"5"])
@pytest.mark.parametrize("name", Settings.names())
def test_a_setting_of_the_wrong_type_is_one_error_naming_it(settings, name, wrong):
    setattr(settings, f"CLEANUP_{name}", wrong)
    errors = [e for check in SETTING_CHECKS for e in check() if e.is_serious()]
    assert [(e.id, e.msg.split(";")[0]) for e in errors] == [
        (CHECKED_BY[name], f"CLEANUP_{name} is {wrong!r}")]


def test_the_settings_page_lists_every_setting_with_its_default_and_check():
    page = (ROOT / "docs/settings.md").read_text()
    section = page.split("\n## Engine (`cleanup`)\n", 1)[1].split("\n## ", 1)[0]
    table = {name: (default, meaning) for name, default, meaning in re.findall(
        r"^\| `CLEANUP_(\w+)` \| (.*?) \| (.*) \|$", section, re.M)}
    assert sorted(table) == sorted(Settings.names())

    def shown(value) -> str:
        return str(value) if isinstance(value, int | float) else f"`{json.dumps(value)}`"

    wrong_defaults = {
        name: default for name, (default, _) in table.items()
        if default != shown(DEFAULTS[name]) and not default.startswith(f"{shown(DEFAULTS[name])} (")
    }
    assert wrong_defaults == {}
    assert [name for name, (_, meaning) in table.items()
            if f"`{CHECKED_BY[name]}`" not in meaning] == []


def test_e001_retry_must_exceed_timeout(settings):
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "timeout": 60, "retry": 60}
    assert ids(check_queue_settings()) == ["cleanup.E001"]


def test_e002_queue_must_share_the_models_alias(settings):
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "orm": "queue"}
    assert ids(check_queue_settings()) == ["cleanup.E002"]


@pytest.mark.parametrize("ceiling", ["MAX_ITEMS_PER_CHUNK", "MAX_RANGE_ROWS_PER_CHUNK"])
def test_e006_the_chunk_size_floor_must_not_exceed_a_ceiling(settings, ceiling):
    settings.CLEANUP_MIN_ROWS_PER_CHUNK = 3_000
    setattr(settings, f"CLEANUP_{ceiling}", 2_000)
    assert ids(check_settings()) == ["cleanup.E006"]
    assert check_queue_settings() == []


def test_e006_message_names_every_chunk_sizing_setting(settings):
    settings.CLEANUP_CHUNK_BUDGET_MS = 40  # conftest turns sizing off
    settings.CLEANUP_MIN_ROWS_PER_CHUNK = 3_000
    (error,) = check_settings()
    assert error.msg == (
        "Chunk sizing is inconsistent: CLEANUP_CHUNK_BUDGET_MS=40, "
        "CLEANUP_MIN_ROWS_PER_CHUNK=3000, CLEANUP_MAX_ITEMS_PER_CHUNK=2000, "
        "CLEANUP_MAX_RANGE_ROWS_PER_CHUNK=100000.")


def test_e006_a_floor_equal_to_the_ceilings_is_allowed(settings):
    settings.CLEANUP_MIN_ROWS_PER_CHUNK = 2_000
    assert check_settings() == []


def test_w001_catch_up_should_be_off(settings):
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "catch_up": True}
    assert ids(check_queue_settings()) == ["cleanup.W001"]


@pytest.fixture
def extra_policy(chunk_size):
    # chunk_size restores the registry afterwards.
    return lambda **changes: register_policy(replace(get_policy("expire-leases"), **changes))


def test_e003_unknown_model(extra_policy):
    extra_policy(name="ghost", model_label="engine_app.Ghost")
    assert ids(check_policies()) == ["cleanup.E003"]


def test_e004_model_that_cannot_be_fast_deleted(extra_policy):
    # Deleting an account cascades to its leases and logs: SELECT-then-DELETE.
    extra_policy(name="accounts", model_label="engine_app.Account",
                 eligible=lambda cutoff: Q(name__startswith="gone"))
    assert ids(check_policies()) == ["cleanup.E004"]


def test_e005_eligibility_through_a_relation(extra_policy):
    extra_policy(name="joined", eligible=lambda cutoff: Q(account__name="x"))
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


def test_e010_range_chunks_need_a_partition_that_is_never_null(chunk_size):
    # chunk_size restores the registry afterwards.
    register_policy(replace(get_policy("purge-cleanup-slots"), name="by-nullable-run",
                            partition_field="run"))
    assert ids(check_policies()) == ["cleanup.E010"]


@pytest.mark.parametrize("value", [0, -1, 4.0, "4", True])
def test_e011_window_must_be_a_whole_number_of_chunks_from_1(settings, value):
    settings.CLEANUP_WINDOW = value
    assert ids(check_window()) == ["cleanup.E011"]


def setting_errors(settings, name: str, value) -> list[checks.CheckMessage]:
    setattr(settings, f"CLEANUP_{name}", value)
    return check_settings()


@pytest.mark.parametrize("value", [0, -1, True, "5", 5.0])
def test_e013_unfinished_deliveries_limit_must_be_a_whole_number_from_1(settings, value):
    assert ids(setting_errors(settings, "MAX_UNFINISHED_DELIVERIES", value)) == ["cleanup.E013"]


def test_e013_message_names_the_setting_its_value_and_what_to_set(settings):
    (error,) = setting_errors(settings, "MAX_UNFINISHED_DELIVERIES", 0)
    assert error.msg == ("CLEANUP_MAX_UNFINISHED_DELIVERIES is 0; it must be a whole number "
                         "of deliveries, at least 1.")
    assert error.hint == (
        "Set how many deliveries of a chunk may start without completing before it is "
        "dead-lettered; at 0 every chunk would be dead-lettered on its first delivery. "
        "The default is 5.")
    assert isinstance(error, checks.Error)


@pytest.mark.parametrize("value", [-1, True, False, "3", 2.5, None])
def test_e014_transient_retries_must_be_a_whole_number_not_a_bool(settings, value):
    assert ids(setting_errors(settings, "TRANSIENT_RETRIES", value)) == ["cleanup.E014"]


def test_e014_zero_transient_retries_is_allowed(settings):
    assert setting_errors(settings, "TRANSIENT_RETRIES", 0) == []


@pytest.mark.parametrize("value", [-0.1, "0.2", True, float("nan"), float("inf")])
def test_e015_transient_backoff_must_be_a_finite_number_of_seconds(settings, value):
    assert ids(setting_errors(settings, "TRANSIENT_BACKOFF", value)) == ["cleanup.E015"]


@pytest.mark.parametrize("value", [0, 1])
def test_e015_backoff_may_be_zero_or_an_int(settings, value):
    assert setting_errors(settings, "TRANSIENT_BACKOFF", value) == []


@pytest.mark.parametrize("value", ["abc", "5000", 0, -5, 2_147_483_648, 5000.0, True])
def test_e016_lock_timeout_must_be_whole_milliseconds_postgresql_accepts(settings, value):
    assert ids(setting_errors(settings, "LOCK_TIMEOUT_MS", value)) == ["cleanup.E016"]


def test_e016_message_shows_the_mistaken_value(settings):
    (error,) = setting_errors(settings, "LOCK_TIMEOUT_MS", "abc")
    assert error.msg == ("CLEANUP_LOCK_TIMEOUT_MS is 'abc'; it must be a whole number of "
                         "milliseconds from 1 to 2147483647.")


@pytest.mark.parametrize("value", [30, 0, "120", None])
def test_e017_schedule_grace_must_exceed_the_scheduler_pass(settings, value):
    assert ids(setting_errors(settings, "SCHEDULE_GRACE_SECONDS", value)) == ["cleanup.E017"]


def test_e017_a_grace_just_above_the_scheduler_pass_is_allowed(settings):
    assert setting_errors(settings, "SCHEDULE_GRACE_SECONDS", 30.5) == []


@pytest.mark.parametrize("value", [90, 60, "180", True])
def test_e018_heartbeat_staleness_must_exceed_a_minute_and_a_late_pass(settings, value):
    assert ids(setting_errors(settings, "HEARTBEAT_STALE_SECONDS", value)) == ["cleanup.E018"]


@pytest.mark.parametrize("value", [0, 36_501, "30", 1.5, True])
def test_e019_ledger_retention_must_be_whole_days_within_a_century(settings, value):
    assert ids(setting_errors(settings, "LEDGER_RETENTION_DAYS", value)) == ["cleanup.E019"]


@pytest.mark.parametrize("value", [0, 36_501, "7", None])
def test_e020_task_result_retention_must_be_whole_days_within_a_century(settings, value):
    assert ids(setting_errors(settings, "TASK_RESULT_RETENTION_DAYS", value)) == ["cleanup.E020"]


@pytest.mark.parametrize("value", [None, 123, " secret", "secret\n"])
def test_e021_metrics_token_must_be_a_string_a_header_can_match(settings, value):
    assert ids(setting_errors(settings, "METRICS_TOKEN", value)) == ["cleanup.E021"]


@pytest.mark.parametrize("value", [None, 10, {"10.0.0.0/8": True}])
def test_e022_metrics_networks_must_be_a_list_or_a_string(settings, value):
    assert ids(setting_errors(settings, "METRICS_ALLOWED_NETWORKS", value)) == ["cleanup.E022"]
    assert check_metrics_networks() == []


def test_e022_a_networks_setting_of_the_wrong_shape_never_fails_a_scrape(db, client, settings):
    settings.CLEANUP_METRICS_ALLOWED_NETWORKS = None
    settings.CLEANUP_METRICS_TOKEN = "secret"
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 403
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1",
                      HTTP_AUTHORIZATION="Bearer secret").status_code == 200


@pytest.mark.parametrize("value", [0, -1, 86_401, float("nan"), "10", True, None])
def test_e023_replica_lag_must_be_seconds_above_0_and_at_most_a_day(settings, value):
    assert ids(setting_errors(settings, "MAX_REPLICA_LAG", value)) == ["cleanup.E023"]


@pytest.mark.parametrize("value", [0, 2_147_483_648, 200.0, "200", True])
def test_e024_lock_wait_limit_must_be_whole_milliseconds_from_1(settings, value):
    assert ids(setting_errors(settings, "MAX_LOCK_WAIT_MS", value)) == ["cleanup.E024"]


@pytest.mark.parametrize("value", [-1, 301, float("nan"), "2", True])
def test_e025_pressure_reading_must_be_reused_0_to_300_seconds(settings, value):
    assert ids(setting_errors(settings, "PRESSURE_CHECK_SECONDS", value)) == ["cleanup.E025"]


@pytest.mark.parametrize("value", [
    "tests.hostile_indicators.answer", ["no.such.module.indicator"], ["cleanup.conf.PREFIX"], [1]])
def test_e026_indicators_must_be_paths_of_callables(settings, value):
    assert ids(setting_errors(settings, "PRESSURE_INDICATORS", value)) == ["cleanup.E026"]


@pytest.mark.parametrize("value", [0, -1, 2_147_483_648, 30_000.0, "30000", True])
def test_e027_statement_timeout_must_be_whole_milliseconds_postgresql_accepts(settings, value):
    assert ids(setting_errors(settings, "STATEMENT_TIMEOUT_MS", value)) == ["cleanup.E027"]


@pytest.mark.parametrize("value", [0, 0.5, 86_401, "30", True, None])
def test_e028_sync_claim_must_be_1_to_86400_seconds(settings, value):
    assert ids(setting_errors(settings, "SYNC_CLAIM_SECONDS", value)) == ["cleanup.E028"]


@pytest.mark.parametrize("value", [None, 2, " worker-2", "w" * 256])
def test_e029_node_name_must_be_a_trimmed_string_of_at_most_255(settings, value):
    assert ids(setting_errors(settings, "NODE_NAME", value)) == ["cleanup.E029"]


@pytest.mark.parametrize("value", [0, 2_147_483_648, 50.0, "50", True])
def test_e030_row_lock_wait_must_be_whole_milliseconds_postgresql_accepts(settings, value):
    assert ids(setting_errors(settings, "ROW_LOCK_WAIT_MS", value)) == ["cleanup.E030"]


@pytest.mark.parametrize("value", [1, 10_001, 20.0, "20", True])
def test_e031_failing_chunks_must_be_a_whole_number_from_2_to_10000(settings, value):
    assert ids(setting_errors(settings, "FAILING_CHUNKS", value)) == ["cleanup.E031"]


@pytest.mark.parametrize("value", [-1, 60_001, float("nan"), "40", True])
def test_e036_chunk_budget_must_be_0_to_60000_milliseconds(settings, value):
    assert ids(setting_errors(settings, "CHUNK_BUDGET_MS", value)) == ["cleanup.E036"]


@pytest.mark.parametrize("value", [0, 0.5])
def test_e036_a_budget_of_0_turns_sizing_off_and_fractions_are_allowed(settings, value):
    assert setting_errors(settings, "CHUNK_BUDGET_MS", value) == []


@pytest.mark.parametrize("value", [0, -1, 50.0, "50", True])
def test_e037_chunk_size_floor_must_be_a_whole_number_of_rows(settings, value):
    assert ids(setting_errors(settings, "MIN_ROWS_PER_CHUNK", value)) == ["cleanup.E037"]


@pytest.mark.parametrize("value", [0, 2_000.0, "2000", None])
def test_e038_items_ceiling_must_be_a_whole_number_of_rows(settings, value):
    assert ids(setting_errors(settings, "MAX_ITEMS_PER_CHUNK", value)) == ["cleanup.E038"]


@pytest.mark.parametrize("value", [0, 1e5, "100000", True])
def test_e039_range_ceiling_must_be_a_whole_number_of_rows(settings, value):
    assert ids(setting_errors(settings, "MAX_RANGE_ROWS_PER_CHUNK", value)) == ["cleanup.E039"]


def test_e039_message_says_which_ceiling(settings):
    (error,) = setting_errors(settings, "MAX_RANGE_ROWS_PER_CHUNK", 0)
    assert error.msg == ("CLEANUP_MAX_RANGE_ROWS_PER_CHUNK is 0; it must be a whole number "
                         "of rows, at least 1.")
    assert error.hint == "Set the most rows a learned range chunk may hold. The default is 100000."


@pytest.mark.parametrize("value", [0, -1, 2_147_483_648, 5_000.0, "5000", None])
def test_e040_idle_in_transaction_timeout_must_be_whole_milliseconds(settings, value):
    assert ids(setting_errors(settings, "IDLE_IN_TRANSACTION_TIMEOUT_MS", value)) == [
        "cleanup.E040"]


def test_w003_retries_should_end_before_the_task_timeout(settings):
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "timeout": 15, "retry": 60}
    settings.CLEANUP_LOCK_TIMEOUT_MS = 2_000
    settings.CLEANUP_TRANSIENT_BACKOFF = 0.5
    assert check_settings() == []  # 4 waits of 2 s + 1.5 * 0.5 * (1 + 2 + 4) s = 13.25 s
    (error,) = setting_errors(settings, "TRANSIENT_BACKOFF", 1)  # 8 + 10.5 s
    assert (error.id, error.level) == ("cleanup.W003", checks.WARNING)
    assert error.msg == (
        "One delivery of a chunk can spend 18.5 s waiting for locks and backing off "
        "(CLEANUP_TRANSIENT_RETRIES=3, CLEANUP_TRANSIENT_BACKOFF=1, "
        "CLEANUP_LOCK_TIMEOUT_MS=2000), not less than the Q_CLUSTER timeout (15 s).")


def test_w003_many_retries_outlast_any_timeout(settings):
    settings.CLEANUP_TRANSIENT_BACKOFF = 0
    assert check_settings() == []
    (error,) = setting_errors(settings, "TRANSIENT_RETRIES", 1_000)
    assert (error.id, error.level) == ("cleanup.W003", checks.WARNING)
    assert error.msg.startswith("One delivery of a chunk can spend unbounded time")


@pytest.mark.parametrize("name, too_long", [
    ("PRESSURE_CHECK_SECONDS", 1e308), ("PRESSURE_CHECK_SECONDS", 301),
    ("TRANSIENT_BACKOFF", 61), ("MAX_REPLICA_LAG", 1e308),
    ("SCHEDULE_GRACE_SECONDS", 86_401), ("HEARTBEAT_STALE_SECONDS", 1e308),
    ("CHUNK_BUDGET_MS", 60_001), ("SYNC_CLAIM_SECONDS", 86_401),
])
def test_every_duration_has_an_upper_bound(settings, name, too_long):
    """A unit mistake (1e308 seconds) would keep a reading, a grace or a backoff for
    ever: each duration's check refuses it, naming the setting."""
    setattr(settings, f"CLEANUP_{name}", too_long)
    errors = [e for check in SETTING_CHECKS for e in check() if e.is_serious()]
    assert [(e.id, e.msg.split(";")[0]) for e in errors] == [
        (CHECKED_BY[name], f"CLEANUP_{name} is {too_long!r}")]
