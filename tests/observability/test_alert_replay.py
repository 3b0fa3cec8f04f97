"""The shipped alert rules replayed by promtool over the series the live app produced.

tests/observability/test_alerts_live.py records, from a real Prometheus scraping the real app, every
series the missed-schedule, stalled-work and late-reminder alerts read, and the alerts
that Prometheus raised. A copy of one such recording is kept in deploy/prometheus/recorded/. Here
promtool evaluates the rules (with the same shortened for: durations as that run) over
those recorded inputs, and must raise exactly the alerts the live Prometheus raised at
the end of each scenario.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from tests.conftest import ROOT
from tests.observability.test_alerts_live import shortened_rules

RECORDING = ROOT / "deploy/prometheus/recorded/alerts-live.json"
PROMTOOL = shutil.which("promtool")
STEP = 2  # seconds between the recorded samples (the live test's scrape interval)
ALERTS = ("CleanupScheduleMissed", "CleanupWorkStalled", "RemindersLate")


def promtool_test(recording: dict, rules: str) -> dict:
    """A promtool unit test: the recorded inputs, and the recorded alerts as expectations
    at the end of each scenario."""
    series = [r for query, results in recording["series"].items()
              if not query.startswith("ALERTS") for r in results]
    start = min(float(r["values"][0][0]) for r in series)
    end = max(float(r["values"][-1][0]) for r in series)
    steps = round((end - start) / STEP)

    def values(result) -> str:
        by_step = {round((float(t) - start) / STEP): v for t, v in result["values"]}
        return " ".join(by_step.get(i, "_") for i in range(steps + 1))

    def labels(metric: dict) -> str:
        inner = ",".join(f'{k}="{v}"' for k, v in sorted(metric.items()) if k != "__name__")
        return f"{metric['__name__']}{{{inner}}}"

    firing = [r for query, results in recording["series"].items() if query.startswith("ALERTS")
              for r in results if r["metric"]["alertstate"] == "firing"]
    phases = recording["phases"]

    def phase_of(moment: float) -> str:
        started = [(t, name) for name, t in phases.items() if t <= moment and name != "end"]
        return max(started)[1]

    # Evaluate where the live Prometheus had an alert firing (the middle of each firing
    # stretch, away from its edges) and at the end of the healthy scenario.
    moments = [float(r["values"][len(r["values"]) // 2][0]) for r in firing]
    moments.append(phases["row locks"] - 2 * STEP)
    tests = []
    for moment in sorted(set(moments)):
        at = round((moment - start) / STEP) * STEP
        for alertname in ALERTS:
            expected = [
                {"exp_labels": {k: v for k, v in r["metric"].items()
                                if k not in ("__name__", "alertstate", "alertname")}}
                for r in firing if r["metric"]["alertname"] == alertname
                and any(abs(float(t) - (start + at)) < STEP / 2 for t, _ in r["values"])
            ]
            tests.append({"eval_time": f"{at}s", "alertname": alertname,
                          "exp_alerts": expected, "phase": phase_of(start + at)})
    return {
        "rule_files": [rules],
        "evaluation_interval": f"{STEP}s",
        "tests": [{
            "name": "recorded on the live system",
            "interval": f"{STEP}s",
            "input_series": [{"series": labels(r["metric"]), "values": values(r)}
                             for r in series],
            "alert_rule_test": [{k: v for k, v in t.items() if k != "phase"} for t in tests],
        }],
    }, tests


@pytest.mark.skipif(PROMTOOL is None and os.environ.get("CI") != "true",
                    reason="promtool not installed (apt-get install prometheus)")
def test_the_rules_raise_on_recorded_series_what_the_live_prometheus_raised(tmp_path):
    assert PROMTOOL, "CI must install promtool (Debian package prometheus)"
    recording = json.loads(RECORDING.read_text())
    unit_test, checks = promtool_test(
        recording, str(shortened_rules(tmp_path, annotations=False)))
    # The recording holds each scenario's alert: stalled work under row locks, missed
    # schedules once the scheduler died (every minutely policy, and an hourly purge
    # whose slot fell in that time) with the reminder due meanwhile late, and nothing
    # while healthy.
    raised = {}
    for check in checks:
        key = (check["phase"], check["alertname"])
        raised[key] = max(raised.get(key, 0), len(check["exp_alerts"]))
    assert raised == {
        ("healthy", "CleanupScheduleMissed"): 0, ("healthy", "CleanupWorkStalled"): 0,
        ("healthy", "RemindersLate"): 0,
        ("row locks", "CleanupScheduleMissed"): 0, ("row locks", "CleanupWorkStalled"): 1,
        ("row locks", "RemindersLate"): 0,
        ("scheduler dead", "CleanupScheduleMissed"): 4,
        ("scheduler dead", "CleanupWorkStalled"): 0, ("scheduler dead", "RemindersLate"): 1,
    }

    path = tmp_path / "recorded.test.yml"
    path.write_text(json.dumps(unit_test))
    result = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
