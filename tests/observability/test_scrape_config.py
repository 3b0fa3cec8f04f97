"""docs/operations.md's "Scraping with Prometheus" kept true: its two prometheus.yml
examples load in Prometheus (promtool, with the rules render_rules.py writes) and scrape
one target at /metrics; /metrics answers the header the token form makes Prometheus
send and the scraper the network form allows, and no one else; the worked example of
the runbook base renders the link the page shows."""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys

import pytest
from django.urls import reverse

from tests.conftest import ROOT
from tests.observability.test_metrics_alert_rules import PROMETHEUS, PROMTOOL

YAML_BLOCK = re.compile(r"^```yaml\n(.*?)^```", re.MULTILINE | re.DOTALL)
SH_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.MULTILINE | re.DOTALL)
OUTSIDE = "198.51.100.7"  # an address in no allowed network (TEST-NET-2)


def scraping() -> str:
    """The page's subsection "Scraping with Prometheus"."""
    text = (ROOT / "docs/operations.md").read_text()
    return text.split("\n### Scraping with Prometheus\n", 1)[1].split("\n### ", 1)[0]


def token_and_network_forms() -> tuple[str, str]:
    token_form, network_form = YAML_BLOCK.findall(scraping())
    return token_form, network_form


def values(config: str, key: str) -> list[str]:
    """Every value given to ``key`` in a YAML block, without its comment."""
    return re.findall(rf"^[ -]*{key}: (.+?)(?:\s+#.*)?$", config, re.MULTILINE)


def render_command() -> tuple[str, dict[str, str]]:
    """The worked example's render_rules.py command: the script's path and its options."""
    (commands,) = SH_BLOCK.findall(scraping())
    python, script, *arguments = shlex.split(commands.replace("\\\n", " ").splitlines()[0])
    assert python == "python3"
    return script, dict(zip(arguments[::2], arguments[1::2], strict=True))


def rendered_rules(base: str, output) -> str:
    result = subprocess.run([sys.executable, str(PROMETHEUS / "render_rules.py"), "--base-url",
                             base, "--output", str(output)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return output.read_text()


def test_each_scrape_config_reads_the_metrics_view_from_one_target():
    for config in token_and_network_forms():
        assert values(config, "job_name") == ["seat-hold-cleanup"]
        assert values(config, "metrics_path") == [reverse("cleanup-metrics")] == ["/metrics"]
        assert values(config, "scrape_interval") == ["30s"]
        # Two would give each policy two series, and the rules' on(policy) an error.
        (targets,) = values(config, "targets")
        assert len(ast.literal_eval(targets)) == 1


@pytest.mark.django_db
def test_the_token_form_sends_the_header_metrics_answers(client, settings):
    token_form, _ = token_and_network_forms()
    (kind,), (credentials,) = values(token_form, "type"), values(token_form, "credentials")
    header = f"{kind} {credentials}"  # what Prometheus sends for `authorization`
    assert f"`Authorization: {header}`" in scraping()
    settings.CLEANUP_METRICS_TOKEN = credentials
    settings.CLEANUP_METRICS_ALLOWED_NETWORKS = []  # the production profile's default

    assert client.get("/metrics", REMOTE_ADDR=OUTSIDE, HTTP_AUTHORIZATION=header).status_code == 200
    assert client.get("/metrics", REMOTE_ADDR=OUTSIDE,
                      HTTP_AUTHORIZATION=header.lower()).status_code == 403  # "case included"
    assert client.get("/metrics", REMOTE_ADDR=OUTSIDE).status_code == 403


@pytest.mark.django_db
def test_the_network_form_admits_its_scraper_and_no_other(client, settings):
    _, network_form = token_and_network_forms()
    assert "authorization" not in network_form
    page = scraping()
    (network,) = re.findall(r"`METRICS_ALLOWED_NETWORKS=([^`]+)`", page)
    (setting,) = re.findall(r"`CLEANUP_METRICS_ALLOWED_NETWORKS = (\[[^`]+\])`", page)
    (scraper,) = re.findall(r"a Prometheus\s+at (\d+\.\d+\.\d+\.\d+)", page)
    assert ast.literal_eval(setting) == network.split(",")
    settings.CLEANUP_METRICS_TOKEN = ""

    for allowed in (network, ast.literal_eval(setting)):  # the environment's form, the list
        settings.CLEANUP_METRICS_ALLOWED_NETWORKS = allowed
        assert client.get("/metrics", REMOTE_ADDR=scraper).status_code == 200
        assert client.get("/metrics", REMOTE_ADDR=OUTSIDE).status_code == 403


def test_the_worked_example_renders_the_runbook_link_the_page_shows(tmp_path):
    script, options = render_command()
    assert (ROOT / script) == PROMETHEUS / "render_rules.py"
    assert list(options) == ["--base-url", "--output"]
    token_form, _ = token_and_network_forms()
    # Prometheus loads the file the example writes.
    assert re.search(r"^rule_files:\n  - (\S+)", token_form, re.MULTILINE)[1] == options["--output"]

    rules = rendered_rules(options["--base-url"], tmp_path / "cleanup.yml")
    (shown,) = [line for line in re.findall(r'`(runbook_url: "[^"]+")`', scraping())
                if "${" not in line]
    assert shown == f'runbook_url: "{options["--base-url"]}#cleanupworkstalled"'
    assert f"        {shown}\n" in rules


@pytest.mark.skipif(PROMTOOL is None and os.environ.get("CI") != "true",
                    reason="promtool not installed (apt-get install prometheus)")
def test_the_scrape_configs_load_in_prometheus_with_the_rendered_rules(tmp_path):
    assert PROMTOOL, "CI must install promtool (Debian package prometheus)"
    _, options = render_command()
    rules = tmp_path / "cleanup.yml"
    shipped = rendered_rules(options["--base-url"], rules).count("- alert: ")

    for name, config in zip(("token", "network"), token_and_network_forms(), strict=True):
        prometheus_yml = tmp_path / f"{name}.yml"
        prometheus_yml.write_text(config.replace(options["--output"], str(rules)))
        # promtool refuses unknown or misplaced keys (strict YAML), as Prometheus does.
        result = subprocess.run([PROMTOOL, "check", "config", str(prometheus_yml)],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "is valid prometheus config file syntax" in result.stdout
        if name == "token":
            assert f"SUCCESS: {shipped} rules found" in result.stdout
