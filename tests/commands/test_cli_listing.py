"""The listing commands: recent runs (cleanup_runs), a run's chunks (cleanup_chunks) and
the registered policies (cleanup_policies), in text with thousands separators and in
JSON."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_q.models import OrmQ

from cleanup import policies
from cleanup.engine.dispatch import dispatch
from cleanup.engine.worker import apply_chunk
from cleanup.models import Chunk, Run
from cleanup.observability.overview import overview
from cleanup.observability.status import run_summary
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
    policies.register_policy(replace(policies.get_policy("expire-leases"), schedule="* * * * *"))
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


def ledger(runs: int) -> list[Run]:
    """``runs`` runs a minute apart, newest first, of a delete policy, an update policy and
    a policy no longer registered, one in four still running; each with a chunk acknowledged,
    committed, dead-lettered and planned, the second also one in a state the code does not
    know."""
    now = timezone.now()
    made = Run.objects.bulk_create(
        Run(policy=("expire-leases", "flag-leases", "retired-rule")[i % 3],
            dispatch_key=f"listed-{i}", cutoff=now - timedelta(minutes=i, hours=1),
            scheme="items", trigger="schedule", chunks_planned=4, candidates=4000,
            state=Run.State.RUNNING if i % 4 == 0 else Run.State.COMPLETED_WITH_DEAD_LETTERS,
            planned_all=i % 4 != 0, created_at=now - timedelta(minutes=i),
            finished_at=None if i % 4 == 0 else now - timedelta(minutes=i, seconds=-30))
        for i in range(runs))
    states = ("acknowledged", "committed", "dead_lettered", "planned")
    Chunk.objects.bulk_create(
        Chunk(run=run, chunk_id=number, state=state, message={"chunk_id": number},
              rows_deleted=0 if run.policy == "flag-leases" else 1000 + number,
              rows_updated=1000 + number if run.policy != "expire-leases" else 0)
        for run in made for number, state in enumerate(states, 1))
    Chunk.objects.bulk_create([Chunk(run=made[1], chunk_id=5, state="bogus", message={})])
    return made


def listing_queries(*args) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        call_command("cleanup_runs", *args, stdout=StringIO())
    return [query["sql"] for query in captured.captured_queries]


def test_runs_listing_costs_the_same_queries_for_3_runs_as_for_30(db):
    ledger(40)

    assert len(listing_queries("--limit", "3")) == len(listing_queries("--limit", "30"))
    assert len(listing_queries("--limit", "3", "--json")) == len(
        listing_queries("--limit", "30", "--json"))
    assert len(listing_queries("--limit", "3", "--found-work")) == len(
        listing_queries("--limit", "30", "--found-work"))


def test_runs_listing_reads_the_chunks_of_the_runs_it_shows_and_no_others(db):
    runs = ledger(40)
    shown, not_shown = runs[:3], runs[3:]

    reading_chunks = [sql for sql in listing_queries("--limit", "3")
                      if '"cleanup_chunk"' in sql]

    def names(run: Run) -> bool:  # Django sends a uuid as its 32 hex digits
        return run.pk.hex in reading_chunks[0] or str(run.pk) in reading_chunks[0]

    assert len(reading_chunks) == 1
    assert all(names(run) for run in shown)
    assert not any(names(run) for run in not_shown)


def test_runs_listing_counts_the_runs_behind_a_full_page_only(db):
    ledger(40)

    assert run_json("cleanup_runs", "--limit", "3")["total"] == 40
    assert run_json("cleanup_runs", "--limit", "40")["total"] == 40
    assert run_json("cleanup_runs", "--limit", "41")["total"] == 40
    assert text("cleanup_runs", "--limit", "3")[-1] == "(3 of 40 runs; --limit for more)"
    # Everything matching is shown: there is nothing left to count.
    assert not any("COUNT(*)" in sql and 'FROM "cleanup_run"' in sql
                   for sql in listing_queries("--limit", "41"))


def test_runs_listing_shows_what_run_summary_reads_of_each_run(db):
    ledger(12)
    fields = ("run_id", "policy", "scheme", "state", "trigger", "cutoff", "planned_all",
              "mutation", "rows_changed", "rows_deleted", "rows_updated", "created_at",
              "finished_at")

    listed = run_json("cleanup_runs", "--limit", "12")["runs"]

    assert len(listed) == 12
    for row in listed:
        summary = run_summary(Run.objects.get(pk=row["run_id"]))
        assert {name: row[name] for name in fields} == {name: summary[name] for name in fields}
        chunks = dict(row["chunks"])
        assert chunks.pop("done") == summary["chunks"]["committed"] + summary["chunks"][
            "acknowledged"]
        assert chunks == summary["chunks"]
    assert {row["mutation"] for row in listed} == {"delete", "update"}
    assert "bogus" in listed[1]["chunks"]
