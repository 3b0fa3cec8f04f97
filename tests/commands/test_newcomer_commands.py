"""What a newcomer meets first (issue 33): `cleanup_status` before any run, what
`make serve` says is missing before it starts (`cleanup_ready`), and a dry run's chunk
count, which a run learning its pace does not keep to."""

from __future__ import annotations

import json
import subprocess
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone
from django_q.models import Schedule

from cleanup.display import utc_text
from cleanup.engine.dispatch import dispatch_in_process
from cleanup.observability import health
from cleanup.policies import all_policies
from cleanup.scheduling import schedules as schedules_module
from cleanup.scheduling.schedules import ENGINE_SCHEDULES, install_schedules, wanted_schedules
from tests.commands.test_cli_environment import shell
from tests.conftest import ROOT, subprocess_env
from tests.console.test_browser import free_port, stop_group
from tests.engine_app.factories import LeaseFactory

NO_RUN_YET = ("No run yet: dispatch one with manage.py cleanup_dispatch --policy NAME "
              "(manage.py cleanup_policies lists them), or let the schedules start them: "
              "manage.py cleanup_schedule, then a manage.py qcluster running.")
NO_CLUSTER = ("no cluster takes work (start manage.py qcluster, in a terminal of its own: "
              "it runs in the foreground)")


def ready_line(**options) -> str:
    out = StringIO()
    call_command("cleanup_ready", stdout=out, **options)
    return out.getvalue()


@pytest.mark.django_db
def test_status_before_any_run_says_how_to_start_one_and_exits_0():
    said = shell("cleanup_status")
    assert (said.returncode, said.stdout, said.stderr) == (0, NO_RUN_YET + "\n", "")

    as_json = shell("cleanup_status", "--json")
    assert (as_json.returncode, as_json.stderr) == (0, "")
    assert json.loads(as_json.stdout) == {"run_id": None, "state": None, "note": NO_RUN_YET,
                                          "gone_policy_halts": []}


@pytest.mark.django_db
def test_ready_names_what_is_missing_then_says_ready_once_nothing_is():
    scheduled = sum(policy.schedule is not None for policy in all_policies())
    schedules = len(wanted_schedules())  # the host's own tasks' too
    assert schedules >= scheduled + len(ENGINE_SCHEDULES)
    assert ready_line() == (
        f"Not ready: {schedules} of {schedules} schedules missing (run manage.py "
        f"cleanup_schedule); {NO_CLUSTER}. Until then the console shows {scheduled} "
        "policies 'Not installed' and /health answers 503.\n")

    install_schedules()
    assert ready_line() == f"Not ready: {NO_CLUSTER}. Until then /health answers 503.\n"

    health.beat()  # what a running cluster's worker does
    assert ready_line() == (f"Ready: {schedules} schedules installed and a cluster takes "
                            "work (/health answers 200).\n")
    assert json.loads(ready_line(json=True)) == {
        "ready": True, "schedules_missing": [], "cluster_taking_work": True,
        "summary": f"Ready: {schedules} schedules installed and a cluster takes work "
                   "(/health answers 200)."}


@pytest.mark.django_db
def test_readiness_says_a_cluster_stopped():
    install_schedules()
    health.beat()
    health.record_stop()
    line = ready_line()
    assert line.startswith("Not ready: no cluster takes work (the cluster stopped (the last, ")
    assert line.endswith("; start manage.py qcluster, in a terminal of its own: it runs in "
                         "the foreground). Until then /health answers 503.\n")


@pytest.mark.django_db
def test_readiness_counts_the_hosts_own_task_schedules(monkeypatch):
    """A host's task (register_task) is installed by cleanup_schedule with the others:
    readiness waits for it too."""
    monkeypatch.setitem(schedules_module._tasks, "host-report",
                        ("tests.engine_app.tasks.report", "*/5 * * * *"))
    install_schedules()
    health.beat()
    assert ready_line().startswith("Ready: ")
    Schedule.objects.filter(name="cleanup:host-report").delete()

    assert json.loads(ready_line(json=True))["schedules_missing"] == ["cleanup:host-report"]


@pytest.mark.django_db
def test_make_serve_says_what_is_missing_before_gunicorn_starts(tmp_path):
    process = subprocess.Popen(
        ["make", "--no-print-directory", "serve", f"SERVE_ADDRESS=127.0.0.1:{free_port()}"],
        cwd=ROOT, env=subprocess_env(DJANGO_STATIC_ROOT=str(tmp_path / "static")),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
    try:
        for line in process.stdout:
            lines.append(line)
            if "Listening at" in line:  # gunicorn is up
                break
    finally:
        stop_group(process)
    said = [line for line in lines if line.startswith(("Not ready", "Ready"))]
    assert said and said[0].startswith("Not ready: ") and NO_CLUSTER in said[0]
    assert lines.index(said[0]) < len(lines) - 1  # before gunicorn listens


@pytest.mark.django_db
def test_a_dry_run_counts_at_the_first_chunks_size_and_a_learning_run_takes_fewer(
        settings, chunk_size, account):
    settings.CLEANUP_CHUNK_BUDGET_MS = 40  # sizing on, as in production
    chunk_size("expire-leases", 10)
    LeaseFactory.create_batch(200, account=account, expired=True)
    cutoff = timezone.now().replace(microsecond=0) - timedelta(minutes=1)

    out = StringIO()
    call_command("cleanup_dispatch", "--policy", "expire-leases", "--dry-run",
                 "--cutoff", cutoff.isoformat(), stdout=out)

    assert out.getvalue() == (
        f"Dry run: expire-leases would plan 20 chunks (items) for 200 rows eligible at "
        f"{utc_text(cutoff)} UTC, counted at its first chunks' size (10 rows): a run's "
        "chunks grow as it learns the database's pace, so it usually takes fewer.\n")
    applied = dispatch_in_process("expire-leases", cutoff=cutoff).applied
    assert applied.rows == 200 and applied.chunks < 20


@pytest.mark.django_db
def test_without_learning_the_dry_run_gives_the_one_chunk_size_it_counted_with(
        settings, chunk_size, account):
    chunk_size("expire-leases", 10)
    LeaseFactory.create_batch(25, account=account, expired=True)
    out = StringIO()
    call_command("cleanup_dispatch", "--policy", "expire-leases", "--dry-run", stdout=out)
    assert out.getvalue().endswith(" UTC, 10 rows a chunk.\n")
    assert out.getvalue().startswith("Dry run: expire-leases would plan 3 chunks (items)")


@pytest.mark.django_db
def test_the_consoles_preview_says_what_its_chunk_count_assumes(admin_client, settings,
                                                                chunk_size, account):
    from django.urls import reverse

    settings.CLEANUP_CHUNK_BUDGET_MS = 40
    chunk_size("expire-leases", 10)
    LeaseFactory.create_batch(30, account=account, expired=True)
    page = admin_client.post(reverse("admin:cleanup_run_dispatch"),
                             {"policy": "expire-leases", "_preview": "1"}).content.decode()
    assert ("<strong>3</strong> chunks for <strong>30</strong> rows, counted at its first "
            "chunks&#x27; size (10 rows): a run&#x27;s chunks grow as it learns the "
            "database&#x27;s pace, so it usually takes fewer.</p>") in page
