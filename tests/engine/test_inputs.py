"""Bad input gets one clear line and writes nothing; what is accepted always reads back."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse
from django.utils import timezone as django_timezone
from django_q.models import OrmQ
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cleanup.models import Run
from cleanup.observability.metrics import ledger_collector
from cleanup.observability.overview import overview
from cleanup.observability.status import run_summary
from tests.conftest import ROOT, subprocess_env
from tests.engine_app.factories import LeaseFactory

pytestmark = pytest.mark.django_db


def command(name: str, *args: str) -> dict:
    out = StringIO()
    call_command(name, *args, "--json", stdout=out)
    return json.loads(out.getvalue())


def written() -> tuple[int, int]:
    return Run.objects.count(), OrmQ.objects.count()


def everything_reads_back() -> None:
    """The ledger pages and figures that once failed on a run psycopg could not read."""
    for run in Run.objects.all():
        run_summary(run)
    overview()
    assert list(ledger_collector().collect())


@pytest.mark.parametrize("cutoff, error", [
    ("2026-11-30T10:00:00+16:00", "offsets up to ±15:59:59"),
    ("2026-11-30T10:00:00+05:45:30.5", "in whole seconds"),
    ("0001-01-01T00:00:00+05:45", "before year 1 in UTC"),
    ("2026-11-30T10:00:00", "no timezone offset"),
    ("yesterday", "not an ISO-8601 timestamp"),
    ("", "cutoff is empty"),
    ("9999-12-31T23:00:00-05:00", "after year 9999 in UTC"),
])
def test_a_cutoff_postgresql_cannot_hold_is_refused_and_nothing_written(
        expired_leases, cutoff, error):
    with pytest.raises(CommandError, match=error) as refused:
        command("cleanup_dispatch", "--policy", "expire-leases", "--cutoff", cutoff)
    assert "\n" not in str(refused.value)
    assert written() == (0, 0)


def test_a_year_1_cutoff_in_utc_is_accepted_and_every_page_still_reads(admin_client, account):
    LeaseFactory(account=account, expired=True)
    result = command("cleanup_dispatch", "--policy", "expire-leases", "--cutoff",
                     "0001-01-01T00:00:00+00:00")
    assert result["cutoff"] == "0001-01-01T00:00:00.000000+00:00"
    everything_reads_back()
    for url in (reverse("admin:cleanup_run_changelist"),
                reverse("admin:cleanup_run_change", args=[result["run_id"]]),
                reverse("admin:cleanup_cleanupoverview_changelist"), "/health", "/metrics"):
        assert admin_client.get(url).status_code in (200, 503), url  # 503: no cluster yet


# Mostly whole minutes as real zones have; now and then seconds or fractions of one.
offsets = st.one_of(
    st.integers(-23 * 60 - 59, 23 * 60 + 59).map(lambda m: timezone(timedelta(minutes=m))),
    st.integers(-86_399, 86_399).map(lambda s: timezone(timedelta(seconds=s))),
    st.timedeltas(min_value=-timedelta(hours=23, minutes=59),
                  max_value=timedelta(hours=23, minutes=59)).map(timezone),
)
instants = st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(2026, 1, 1),
                        timezones=offsets)
cutoff_texts = st.one_of(
    st.text(max_size=40),
    instants.map(datetime.isoformat),
    st.builds(lambda moment, spec: moment.isoformat(timespec=spec), instants,
              st.sampled_from(["seconds", "milliseconds", "microseconds", "minutes"])),
)


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=cutoff_texts,
       policy=st.sampled_from(["expire-leases", "purge-lease-logs", "purge-cleanup-runs"]))
def test_any_cutoff_text_is_refused_cleanly_or_makes_a_run_that_reads_back(db, text, policy):
    before = written()
    try:
        result = command("cleanup_dispatch", "--policy", policy, "--cutoff", text)
    except CommandError as exc:
        event("refused")
        assert "\n" not in str(exc).strip()
        assert written() == before
        return
    event("accepted")
    run = Run.objects.get(pk=result["run_id"])
    assert run.cutoff == datetime.fromisoformat(text).astimezone(UTC)
    assert command("cleanup_status", "--run", str(run.pk))["cutoff"] == result["cutoff"]
    everything_reads_back()


@pytest.mark.parametrize("args, error", [
    (["cleanup_dispatch", "--policy", "expire-leases", "--key", ""], "dispatch key is empty"),
    (["cleanup_dispatch", "--policy", "expire-leases", "--key", "k" * 300], "limit is 255"),
    (["cleanup_dispatch", "--policy", "expire-leases", "--cutoff", " "], "cutoff is empty"),
    (["cleanup_status", "--run", ""], "run id is empty"),
    (["cleanup_replay", ""], "run id is empty"),
])
def test_empty_or_overlong_values_are_refused_not_read_as_defaults(expired_leases, args, error):
    with pytest.raises(CommandError, match=error):
        command(*args)
    assert written() == (0, 0)


def test_one_instant_written_with_two_offsets_is_one_replay(expired_leases):
    run_id = command("cleanup_dispatch", "--policy", "expire-leases", "--sync")["run_id"]
    later = django_timezone.now()
    first = command("cleanup_replay", run_id, "--new-cutoff", later.isoformat())
    second = command("cleanup_replay", run_id, "--new-cutoff",
                     later.astimezone(timezone(timedelta(hours=5, minutes=45))).isoformat())
    assert (first["created"], second["created"]) == (True, False)
    assert first["run_id"] == second["run_id"]
    assert Run.objects.count() == 2


def test_sync_dispatch_prints_the_state_the_run_ended_in(expired_leases):
    result = command("cleanup_dispatch", "--policy", "expire-leases", "--sync")
    assert result["state"] == Run.State.COMPLETED
    again = command("cleanup_dispatch", "--policy", "expire-leases", "--sync", "--key", "k")
    assert again["state"] == Run.State.COMPLETED


def test_range_chunks_on_a_uuid_key_are_refused_at_dispatch(db):
    with pytest.raises(CommandError, match="Run.id is a UUIDField, not an integer"):
        command("cleanup_dispatch", "--policy", "purge-cleanup-runs", "--scheme", "range")
    assert written() == (0, 0)


def test_the_admin_confirmation_key_names_one_request(admin_client, expired_leases):
    url = reverse("admin:cleanup_run_dispatch")
    page = admin_client.post(url, {"policy": "expire-leases", "_preview": "1"})
    form = {"cutoff": page.context["preview_cutoff"], "confirm_key": page.context["confirm_key"],
            "_confirm": "1"}
    admin_client.post(url, {**form, "policy": "expire-leases"})

    reused = admin_client.post(url, {**form, "policy": "purge-lease-logs"})
    assert "belongs to run" in reused.content.decode()
    assert Run.objects.count() == 1


def test_the_admin_refuses_a_cutoff_postgresql_cannot_hold(admin_client, expired_leases):
    url = reverse("admin:cleanup_run_dispatch")
    page = admin_client.post(url, {"policy": "expire-leases", "_confirm": "1",
                                   "cutoff": "0001-01-01T00:00:00+05:45",
                                   "confirm_key": "00000000-0000-0000-0000-000000000000"})
    assert "before year 1 in UTC" in page.content.decode()
    assert written() == (0, 0)


@pytest.mark.parametrize("env, error", [
    ({"Q_WORKERS": "abc"}, "Q_WORKERS must be a whole number, not 'abc'"),
    ({"Q_POLL": "fast"}, "Q_POLL must be a number, not 'fast'"),
    ({"DATABASE_URL": "nonsense"}, "DATABASE_URL cannot be read"),
    ({"DATABASE_URL": "postgres://root@127.0.0.1:abc/x"}, "DATABASE_URL cannot be read"),
    ({"DJANGO_PROFILE": "production", "DJANGO_SECRET_KEY": "s" * 50},
     "DJANGO_ALLOWED_HOSTS is required in the production profile"),
])
def test_environment_mistakes_give_one_line_and_a_non_zero_exit(env, error):
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT,
                            env={**subprocess_env(), **env}, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("Configuration error: ") and error in line
