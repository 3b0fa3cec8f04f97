"""The command-line twins of the console's actions."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django_q.models import OrmQ

from cleanup.engine import operations
from cleanup.engine.dispatch import dispatch, dispatch_in_process
from cleanup.exceptions import CleanupError
from cleanup.models import Chunk, Run
from tests.engine_app.factories import LeaseFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def dead_letter(expired_leases) -> Chunk:
    """A chunk of expire-leases dead-lettered for its message's unknown version, as the
    worker leaves it, with the queue emptied."""
    from cleanup.engine.worker import apply_chunk

    chunk = dispatch("expire-leases").run.chunks.get()
    apply_chunk({**chunk.message, "version": 99})
    OrmQ.objects.all().delete()
    chunk = Chunk.objects.get(pk=chunk.pk)
    assert chunk.state == Chunk.State.DEAD_LETTERED
    return chunk


def run_json(*args) -> dict:
    out = StringIO()
    call_command(*args, "--json", stdout=out)
    return json.loads(out.getvalue())


def test_requeue_sends_dead_letters_once(dead_letter):
    run_id = str(dead_letter.run_id)
    assert run_json("cleanup_requeue", run_id) == {
        "run_id": run_id, "failure_class": None, "dry_run": False, "requeued": 1,
        "skipped": 0}
    assert run_json("cleanup_requeue", run_id, "--chunk", "1") == {
        "run_id": run_id, "failure_class": None, "dry_run": False, "requeued": 0,
        "skipped": 1}
    assert OrmQ.objects.count() == 1


def test_requeue_one_failure_class_across_runs(dead_letter, account):
    LeaseFactory(account=account, expired=True)
    other = dispatch("expire-leases").run.chunks.get()
    Chunk.objects.filter(pk=other.pk).update(state="dead_lettered", failure_class="poison")

    result = run_json("cleanup_requeue", "--class", "malformed", "--noinput")

    assert (result["requeued"], result["skipped"]) == (1, 0)
    assert Chunk.objects.get(pk=dead_letter.pk).state == "enqueued"
    assert Chunk.objects.get(pk=other.pk).state == "dead_lettered"
    with pytest.raises(CommandError, match="give a RUN_ID, or --class"):
        call_command("cleanup_requeue")


def test_discard_requires_a_reason_and_completes_the_run(dead_letter):
    run_id = str(dead_letter.run_id)
    with pytest.raises(CommandError, match="a reason is required"):
        call_command("cleanup_discard", run_id, "--chunk", "1", "--reason", " ",
                     interactive=False)
    assert Chunk.objects.get(pk=dead_letter.pk).state == "dead_lettered"

    result = run_json("cleanup_discard", run_id, "--chunk", "1", "--reason", "obsolete",
                      "--noinput")

    assert result == {"run_id": run_id, "discarded": 1, "skipped": 0}
    assert Run.objects.get(pk=run_id).state == Run.State.COMPLETED


@pytest.mark.parametrize(("reason", "refusal"), [
    ("two\nlines", "one line of printable text"),
    ("a\x00b", "one line of printable text"),
    ("x" * 501, "at most 500 characters"),
])
def test_a_chunk_discard_reason_follows_the_rule_of_every_operator_reason(
        dead_letter, reason, refusal):
    run_id = str(dead_letter.run_id)
    with pytest.raises(CommandError, match=refusal):
        call_command("cleanup_discard", run_id, "--chunk", "1", "--reason", reason,
                     interactive=False)
    with pytest.raises(CleanupError, match=refusal):
        operations.discard([dead_letter.pk], reason)
    assert Chunk.objects.get(pk=dead_letter.pk).state == "dead_lettered"


def test_discard_without_confirmation_changes_nothing(dead_letter, monkeypatch):
    monkeypatch.setattr("builtins.input", lambda prompt: "no")
    with pytest.raises(CommandError, match="Cancelled; nothing changed"):
        call_command("cleanup_discard", str(dead_letter.run_id), "--chunk", "1",
                     "--reason", "obsolete")
    assert Chunk.objects.get(pk=dead_letter.pk).state == "dead_lettered"


def test_cancel_twice_is_harmless_and_a_finished_run_is_refused(dead_letter, account):
    LeaseFactory(account=account, expired=True)
    run = dispatch("expire-leases").run

    first = run_json("cleanup_cancel", str(run.pk), "--noinput")
    again = run_json("cleanup_cancel", str(run.pk), "--noinput")

    assert (first["cancelled"], again["cancelled"], again["state"]) == (True, False,
                                                                        "cancelled")
    with pytest.raises(CommandError, match="already completed_with_dead_letters"):
        call_command("cleanup_cancel", str(dead_letter.run_id), interactive=False)


def test_operator_commands_refuse_unknown_runs_and_chunks(dead_letter):
    with pytest.raises(CommandError, match="no run with id nope"):
        call_command("cleanup_requeue", "nope")
    with pytest.raises(CommandError, match="has no chunk 5"):
        call_command("cleanup_discard", str(dead_letter.run_id), "--chunk", "5",
                     "--reason", "x", interactive=False)
    assert Chunk.objects.get(pk=dead_letter.pk).state == "dead_lettered"


def test_replay_of_a_cancelled_run_is_refused(account):
    LeaseFactory(account=account, expired=True)
    run = dispatch("expire-leases").run
    call_command("cleanup_cancel", str(run.pk), interactive=False, stdout=StringIO())
    with pytest.raises(CommandError, match="is cancelled"):
        call_command("cleanup_replay", str(run.pk))


def test_commands_take_the_short_run_id_the_admin_shows(dead_letter):
    short = str(dead_letter.run_id)[:8]

    assert run_json("cleanup_status", short)["run_id"] == str(dead_letter.run_id)
    assert run_json("cleanup_requeue", short.upper())["requeued"] == 1


def test_an_ambiguous_short_id_is_refused_naming_the_runs_and_a_prefix_is_not_an_id(
        expired_leases):
    import uuid

    from django.utils import timezone
    for suffix in ("1", "2"):
        Run.objects.create(id=uuid.UUID(f"abcd0000-0000-0000-0000-00000000000{suffix}"),
                           policy="expire-leases", dispatch_key=f"k{suffix}",
                           cutoff=timezone.now(), scheme="items", trigger="command",
                           planned_all=True)

    with pytest.raises(CommandError) as refused:
        call_command("cleanup_status", "ABCD0000")
    assert str(refused.value) == (
        "short run id 'abcd0000' is ambiguous: it matches "
        "abcd0000-0000-0000-0000-000000000002, abcd0000-0000-0000-0000-000000000001; "
        "give the full id")
    for text in ("abcd", "abcd0000-00", "abcd00000"):
        with pytest.raises(CommandError, match=f"^no run with id {text}: give its full id "
                           "or the 8 hex digits the admin shows$"):
            call_command("cleanup_status", text)
    assert run_json("cleanup_status", "abcd0000-0000-0000-0000-000000000002")["run_id"].endswith(
        "2")


def test_runs_lists_recent_runs_with_filters_and_says_when_there_are_none(expired_leases):
    out = StringIO()
    call_command("cleanup_runs", stdout=out)
    assert out.getvalue().strip() == "No runs yet: nothing has been dispatched."

    worked = dispatch_in_process("expire-leases").run
    idle = dispatch_in_process("expire-leases").run  # found nothing

    listed = run_json("cleanup_runs")
    assert [r["run_id"] for r in listed["runs"]] == [str(idle.pk), str(worked.pk)]
    assert listed["runs"][1]["chunks"]["total"] == 1
    assert listed["runs"][1]["rows_deleted"] == 5
    assert [r["run_id"] for r in run_json("cleanup_runs", "--found-work")["runs"]] == [
        str(worked.pk)]
    assert run_json("cleanup_runs", "--state", "running") == {"runs": [], "total": 0}
    assert run_json("cleanup_runs", "--since", "1h", "--limit", "1")["total"] == 2
    out = StringIO()
    call_command("cleanup_runs", "--policy", "purge-cleanup-runs", stdout=out)
    assert out.getvalue().strip() == "No runs match."
    with pytest.raises(CommandError, match="argument --since: expected an ISO-8601 timestamp "
                       "with offset or an age such as 30m, 6h or 2d .*, not 'soon'"):
        call_command("cleanup_runs", "--since", "soon")


def test_commands_speak_of_rows_updated_for_an_update_policy(account):
    from tests.engine_app.services import keep_lease

    flagged = LeaseFactory.create_batch(3, account=account, expired=True)
    marked = dispatch_in_process("flag-leases").run
    for lease in flagged:  # out of expire-leases' reach
        keep_lease(lease.pk)
    LeaseFactory.create_batch(2, account=account, expired=True)
    expired = dispatch_in_process("expire-leases").run

    status = run_json("cleanup_status", str(marked.pk))
    assert (status["mutation"], status["rows_changed"], status["rows_updated"],
            status["rows_deleted"]) == ("update", 3, 3, 0)
    out = StringIO()
    call_command("cleanup_status", str(marked.pk), stdout=out)
    assert "3 rows updated, 0 skipped" in out.getvalue()
    out = StringIO()
    call_command("cleanup_status", str(expired.pk), stdout=out)
    assert "2 rows deleted, 0 skipped" in out.getvalue()
    listed = {r["policy"]: r for r in run_json("cleanup_runs")["runs"]}
    assert listed["flag-leases"]["rows_changed"] == 3
    assert listed["expire-leases"]["rows_changed"] == listed["expire-leases"]["rows_deleted"] == 2
    out = StringIO()
    call_command("cleanup_runs", stdout=out)
    header, *rows = out.getvalue().splitlines()
    assert "changed" in header
    assert any(r.startswith(str(marked.pk)[:8]) and " 3  " in r for r in rows)


def test_under_json_an_error_is_a_json_object_on_stderr(db):
    from tests.conftest import manage

    process = manage("cleanup_status", "ffffffff", "--json")
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 1
    assert json.loads(output.strip().splitlines()[-1]) == {"error": "no run with id ffffffff"}
