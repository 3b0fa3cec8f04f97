"""What drifts: the table of series in docs/operations.md, the dashboard's queries and
variable, and the alert annotations the dashboard shows, against what the collectors
emit."""

from __future__ import annotations

import json
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ROOT

pytestmark = pytest.mark.django_db
DASHBOARD = ROOT / "deploy/grafana/cleanup-dashboard.json"
RULES = ROOT / "deploy/prometheus/cleanup-alerts.yml"
# Series without a policy label (per cluster; per database server).
UNLABELLED = {"cleanup_heartbeat_age_seconds", "cleanup_replica_lag_seconds"}


def emitted(client) -> dict[str, str]:
    """Every cleanup and reservations family the app emits, by the name a query or the
    the docs use (counters with _total), and its type."""
    text = client.get("/metrics").content.decode()
    return {
        family.name + ("_total" if family.type == "counter" else ""): family.type
        for family in text_string_to_metric_families(text)
        if family.name.startswith(("cleanup_", "reservations_"))
    }


def documented_series() -> set[str]:
    text = (ROOT / "docs/operations.md").read_text()
    section = text[text.index("\n## Metrics, logs and alerts"):]
    section = section[:section.index("\n## ", 1)]
    return set(re.findall(r"^\| `((?:cleanup|reservations)_[a-z_]+)(?:\{[a-z_,]*\})?` \|",
                          section, re.MULTILINE))


def series_in(expr: str) -> set[str]:
    """The series an expression reads, as the collectors name them (a histogram's
    _bucket, _sum and _count are the histogram)."""
    names = set(re.findall(r"\b(?:cleanup|reservations)_[a-z_]+\b", expr))
    return {re.sub(r"_(bucket|sum|count)$", "", n) if n.endswith(("_bucket", "_sum", "_count"))
            and not n.endswith("_total") else n for n in names}


def panels() -> list[dict]:
    return json.loads(DASHBOARD.read_text())["panels"]


def test_the_operations_table_lists_every_series_emitted_and_no_other(client):
    assert documented_series() == set(emitted(client))


def test_the_dashboard_queries_only_series_that_exist(client):
    names = emitted(client)
    histograms = {n for n, kind in names.items() if kind == "histogram"}
    for panel in panels():
        for target in panel["targets"]:
            read = series_in(target["expr"])
            assert read, f"{panel['title']}: {target['expr']} reads no app series"
            missing = {n for n in read if n not in names and n not in histograms}
            assert not missing, f"{panel['title']}: {target['expr']} reads {missing}"


def test_every_panel_follows_the_policy_variable(client):
    dashboard = json.loads(DASHBOARD.read_text())
    [policy] = [v for v in dashboard["templating"]["list"] if v["name"] == "policy"]
    assert (policy["type"], policy["multi"], policy["includeAll"]) == ("query", True, True)
    assert policy["definition"] == "label_values(cleanup_eligible_rows, policy)"
    assert "cleanup_eligible_rows" in emitted(client)
    for panel in panels():
        for target in panel["targets"]:
            for match in re.finditer(r"\b(cleanup_[a-z_]+)(\{[^}]*\})?", target["expr"]):
                name, matchers = match.group(1), match.group(2) or ""
                if name in UNLABELLED or 'policy="unknown"' in matchers:
                    continue
                assert 'policy=~"$policy"' in matchers, f"{panel['title']}: {name}"


def test_stat_panels_show_the_state_now():
    stats = {p["title"]: p["targets"][0]["expr"] for p in panels() if p["type"] == "stat"}
    reads = {title: series_in(expr) for title, expr in stats.items()}
    assert reads["Eligible rows now"] == {"cleanup_eligible_rows"}
    assert reads["Oldest eligible age"] == {"cleanup_oldest_eligible_age_seconds"}
    assert reads["Dead letters waiting"] == {"cleanup_chunks"}
    assert 'state="dead_lettered"' in stats["Dead letters waiting"]
    assert reads["Runs in flight"] == {"cleanup_runs_running"}
    assert reads["Youngest heartbeat"] == {"cleanup_heartbeat_age_seconds"}
    # They sit in the top row, side by side.
    assert {p["gridPos"]["y"] for p in panels() if p["type"] == "stat"} == {0}


def test_alerts_show_as_annotations_and_name_only_shipped_alerts():
    [annotation] = json.loads(DASHBOARD.read_text())["annotations"]["list"]
    expr = annotation["expr"]
    assert expr.startswith('ALERTS{alertstate="firing", alertname=~"')
    pattern = re.search(r'alertname=~"([^"]+)"', expr).group(1)
    shipped = set(re.findall(r"- alert: (\w+)", RULES.read_text()))
    assert {a for a in shipped if re.fullmatch(pattern, a)} == shipped
    assert series_in(expr) == set()  # Prometheus's own series, not the app's

