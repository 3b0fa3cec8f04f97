"""The alert rules' runbook links: absolute, built from CLEANUP_RUNBOOK_BASE_URL by the
renderer, each to a heading of the alerts section of docs/operations.md."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.project.test_project import github_anchor

PROMETHEUS = ROOT / "deploy/prometheus"
BASE = "https://git.example.org/ops/seat-holds/-/blob/main/docs/operations.md"
PROMTOOL = shutil.which("promtool")


def load_renderer():
    spec = importlib.util.spec_from_file_location("render_rules",
                                                  PROMETHEUS / "render_rules.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


render_rules = load_renderer()
# The page the renderer names as the runbook: its headings are the anchors.
RUNBOOK = ROOT / render_rules.RUNBOOK_PAGE


def runbook_links(rules: str) -> dict[str, str]:
    """Each alert's runbook_url, in the order the rules name them."""
    links, alert = {}, None
    for line in rules.splitlines():
        if found := re.match(r"\s+- alert: (\w+)", line):
            alert = found.group(1)
        elif found := re.match(r'\s+runbook_url: "(.*)"', line):
            links[alert] = found.group(1)
    return links


def runbook_anchors() -> set[str]:
    """GitHub's anchors for the headings of the runbook page's alerts section."""
    text = RUNBOOK.read_text()
    section = text[text.index("\n### Alerts and what to do"):]
    section = section[:section.index("\n## ", 1)]
    headings = re.findall(r"^#{2,6} (.+)$", section, re.MULTILINE)
    return {github_anchor(h) for h in headings}


def render(*args: str, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "CLEANUP_RUNBOOK_BASE_URL"}
    return subprocess.run([sys.executable, str(PROMETHEUS / "render_rules.py"), *args],
                          capture_output=True, text=True, timeout=60,
                          env={**environment, **env})


def test_every_rendered_rule_links_to_its_runbook_heading():
    template = (PROMETHEUS / "cleanup-alerts.yml").read_text()
    alerts = re.findall(r"- alert: (\w+)", template)
    links = runbook_links(render_rules.render(template, BASE))

    assert list(links) == alerts
    anchors = runbook_anchors()
    for alert, link in links.items():
        assert link == f"{BASE}#{alert.lower()}"
        assert link.split("#", 1)[1] in anchors, f"{alert}: no heading for {link}"


def test_the_shipped_template_leaves_only_the_base_to_fill_in():
    links = runbook_links((PROMETHEUS / "cleanup-alerts.yml").read_text())
    assert links and all(link == f"{render_rules.PLACEHOLDER}#{alert.lower()}"
                         for alert, link in links.items())


def test_the_renderer_takes_the_base_from_the_environment(tmp_path):
    output = tmp_path / "rules.yml"
    result = render("--output", str(output), CLEANUP_RUNBOOK_BASE_URL=BASE)

    assert result.returncode == 0, result.stderr
    links = runbook_links(output.read_text())
    assert links and all(link == f"{BASE}#{alert.lower()}" for alert, link in links.items())
    assert render_rules.PLACEHOLDER not in output.read_text()


@pytest.mark.parametrize(("base", "message"), [
    ("", "render_rules: CLEANUP_RUNBOOK_BASE_URL is not set: give the address where "
         "docs/operations.md is served (or --base-url)"),
    ("README.md", "render_rules: runbook base 'README.md' is not an absolute http(s) URL"),
    ("ftp://docs.example.org/README.md",
     "render_rules: runbook base 'ftp://docs.example.org/README.md' is not an absolute "
     "http(s) URL"),
    ("https://docs.example.org/README.md#alerts",
     "render_rules: runbook base 'https://docs.example.org/README.md#alerts' has an "
     "anchor; each rule adds its own"),
    ("https://git.example.org/ops/seat-holds/-/blob/main/README.md",
     "render_rules: runbook base 'https://git.example.org/ops/seat-holds/-/blob/main/"
     "README.md' is the README; the alerts' headings are in docs/operations.md: give the "
     "address where that page is served"),
])
def test_the_renderer_refuses_a_base_that_makes_no_absolute_link(tmp_path, base, message):
    output = tmp_path / "rules.yml"
    result = render("--output", str(output), CLEANUP_RUNBOOK_BASE_URL=base)

    assert result.returncode == 2
    assert result.stderr.strip() == message
    assert not output.exists()


@pytest.mark.skipif(PROMTOOL is None and os.environ.get("CI") != "true",
                    reason="promtool not installed (apt-get install prometheus)")
def test_the_rendered_rules_pass_promtool(tmp_path):
    assert PROMTOOL, "CI must install promtool (Debian package prometheus)"
    output = tmp_path / "cleanup-alerts.yml"
    assert render("--output", str(output), "--base-url", BASE).returncode == 0
    result = subprocess.run([PROMTOOL, "check", "rules", str(output)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    shipped = output.read_text().count("- alert: ")
    assert shipped == 13  # CleanupEventsNotDelivered and CleanupEventsDead, the outbox's
    assert f"SUCCESS: {shipped} rules found" in result.stdout
