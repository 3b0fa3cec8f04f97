"""The listing commands: a run's chunks (cleanup_chunks) and the registered policies
(cleanup_policies), in text with thousands separators and in JSON."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone
from django_q.models import OrmQ

from cleanup import policies
from cleanup.engine.dispatch import dispatch
from cleanup.engine.worker import apply_chunk
from cleanup.models import Chunk
from cleanup.observability.overview import overview
from tests.engine_app.models import Lease

pytestmark = pytest.mark.django_db


def run_json(*args) -> dict:
    out = StringIO()
    call_command(*args, "--json", stdout=out)
    return json.loads(out.getvalue())


def text(*args) -> list[str]:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue().splitlines()


@pytest.fixture
def three_fates(account, chunk_size):
    """A run of three chunks of a policy scheduled every minute: #1 committed (1,000
    rows), #2 dead-lettered for its message, #3 dead-lettered as poison (deliveries kept
    dying)."""
    long_ago = timezone.now() - timedelta(hours=1)
    Lease.objects.bulk_create(
        Lease(account=account, holder=f"holder-{i}", expires_at=long_ago - timedelta(seconds=i))
        for i in range(2100))
    chunk_size("expire-leases", 1000)
    # Registered within chunk_size's block, so it is gone after the test too.
    policies.register(replace(policies.get_policy("expire-leases"), schedule="* * * * *"))
    run = dispatch("expire-leases").run
    first, second, third = run.chunks.order_by("chunk_id")
    apply_chunk(first.message)
    apply_chunk({**second.message, "version": 99})
    # Five deliveries that started and never finished: workers killed mid-chunk.
    Chunk.objects.filter(pk=third.pk).update(deliveries=5)
    apply_chunk(third.message)
    OrmQ.objects.all().delete()
    return run


def test_chunks_lists_state_rows_changed_deliveries_and_cause(three_fates):
    run = three_fates
    second = run.chunks.get(chunk_id=2)
    assert second.cause  # the message's own refusal, e.g. its unknown version
    assert text("cleanup_chunks", str(run.pk)) == [
        f"Run {run.pk} (expire-leases):",
        "  chunk  state              changed  deliveries  cause",
        "     #1  committed            1,000           1  -",
        f"     #2  dead_lettered            0           1  {second.cause}",
        "     #3  dead_lettered            0           6  5 deliveries started without "
        "completing (limit 5)",
    ]


def test_chunks_json_has_cause_and_verdict_apart(three_fates):
    run = three_fates
    result = run_json("cleanup_chunks", str(run.pk)[:8])
    assert (result["run_id"], result["total"], result["state"]) == (str(run.pk), 3, None)
    first, second, third = result["chunks"]
    assert first == {"chunk_id": 1, "state": "committed", "rows_changed": 1000,
                     "rows_deleted": 1000, "rows_updated": 0, "deliveries": 1, "cause": "",
                     "verdict": "", "failure_class": ""}
    assert (second["failure_class"], second["cause"]) == (
        "malformed", run.chunks.get(chunk_id=2).cause)
    assert (third["failure_class"], third["cause"], third["verdict"]) == (
        "poison", "", "5 deliveries started without completing (limit 5)")


def test_chunks_filters_by_state_and_bounds_the_list(three_fates):
    run = three_fates
    result = run_json("cleanup_chunks", str(run.pk), "--state", "dead_lettered", "--limit", "1")
    assert ([c["chunk_id"] for c in result["chunks"]], result["total"]) == ([2], 2)
    lines = text("cleanup_chunks", str(run.pk), "--state", "dead_lettered", "--limit", "1")
    assert lines[-1] == "(1 of 2 dead_lettered chunks; a higher --limit shows more)"
    assert text("cleanup_chunks", str(run.pk), "--state", "retrying") == [
        f"Run {run.pk} (expire-leases) has no retrying chunks."]
    with pytest.raises(CommandError, match="no run with id ffffffff"):
        call_command("cleanup_chunks", "ffffffff")


def test_policies_shows_each_rule_its_last_run_and_the_backlog_overview_reads(three_fates):
    run = three_fates
    listed = {p["policy"]: p for p in run_json("cleanup_policies")["policies"]}
    leases = listed["expire-leases"]
    health = {h.policy: h for h in overview()}["expire-leases"]
    assert leases["last_run"] == {"run_id": str(run.pk), "state": "completed_with_dead_letters",
                                 "created_at": run.created_at.isoformat(),
                                 "finished_at": leases["last_run"]["finished_at"]}
    assert leases["backlog"]["eligible_rows"] == health.eligible_rows == 1100
    assert leases["backlog"]["oldest_eligible_since"] == health.oldest_eligible_since.isoformat()
    assert (leases["scheme"], leases["mutation"], leases["window"], leases["dead_letters"]) == (
        "items", "delete", 4, 2)
    assert leases["schedule"] == "* * * * *" and leases["schedule_installed"] is False
    assert sorted(listed) == sorted(h.policy for h in overview())

    lines = "\n".join(text("cleanup_policies")).split("\n\n")
    block = next(b for b in lines if b.startswith("expire-leases ")).splitlines()
    assert block[:2] == [
        "expire-leases (delete engine_app.Lease, items chunks, window 4)",
        "  schedule  * * * * * (not installed: run cleanup_schedule)",
    ]
    assert re.fullmatch(rf"  last run  {run.pk} completed_with_dead_letters, dispatched "
                        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(.+ ago\)", block[2])
    assert re.fullmatch(r"  backlog   1,100 rows eligible, the oldest waiting .+", block[3])
    assert block[4] == "  dead letters  2"


def test_policies_says_a_policy_never_ran_and_an_installed_schedule_plainly(db):
    call_command("cleanup_schedule", stdout=StringIO())
    block = next(b for b in "\n".join(text("cleanup_policies")).split("\n\n")
                 if b.startswith("purge-cleanup-runs ")).splitlines()
    assert block == [
        "purge-cleanup-runs (delete cleanup.Run, items chunks, window 4)",
        "  schedule  50 * * * *",
        "  last run  none yet",
        "  backlog   none",
    ]
