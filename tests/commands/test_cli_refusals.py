"""Every refusal of a command is one line, or one JSON object under --json, and changes
nothing: what argparse refuses, numbers and durations out of range, two runs at once, an
unknown policy, a prompt nobody answers."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone
from django_q.models import OrmQ

from cleanup.engine.dispatch import dispatch
from cleanup.engine.worker import apply_chunk
from cleanup.models import Chunk, Run
from tests.conftest import ROOT, subprocess_env
from tests.engine_app.factories import LeaseFactory

pytestmark = pytest.mark.django_db


def shell(*args: str, **env: str) -> subprocess.CompletedProcess:
    """Run ``manage.py`` as an operator does, stdout and stderr apart."""
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT,
                          env=subprocess_env(**env), capture_output=True, text=True,
                          timeout=120)


def run_json(*args) -> dict:
    out = StringIO()
    call_command(*args, "--json", stdout=out)
    return json.loads(out.getvalue())


@pytest.mark.parametrize("args, error", [
    (["cleanup_runs", "--limit", "abc"],
     "argument --limit: expected a whole number from 1 to 10,000, not 'abc'"),
    (["cleanup_runs", "--since", "999999999d"],
     "argument --since: '999999999d' is out of range: give more than 0 and at most 36,500d"),
    (["cleanup_runs", "--bogus"], "unrecognized arguments: --bogus"),
    (["cleanup_discard", "ffffffff"],
     "the following arguments are required: --chunk, --reason"),
    (["cleanup_status", "ffffffff", "eeeeeeee"], "unrecognized arguments: eeeeeeee"),
    (["cleanup_requeue", "--class", "bogus"],
     "argument --class: invalid choice: 'bogus' (choose from 'transient', 'poison', "
     "'malformed', 'error')"),
])
def test_under_json_an_argument_refusal_is_one_json_object_without_the_usage(args, error):
    result = shell(*args, "--json")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.endswith("\n") and result.stderr.count("\n") == 1
    assert json.loads(result.stderr) == {"error": error}


def test_dispatch_which_shares_the_base_refuses_a_bad_scheme_as_json_too():
    result = shell("cleanup_dispatch", "--policy", "expire-leases", "--scheme", "bogus",
                   "--json")
    assert (result.returncode, result.stdout, result.stderr.count("\n")) == (2, "", 1)
    assert json.loads(result.stderr)["error"].startswith(
        "argument --scheme: invalid choice: 'bogus'")


def test_without_json_an_argument_refusal_stays_as_django_prints_it():
    result = shell("cleanup_runs", "--limit", "abc")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith("usage: manage.py cleanup_runs ")
    assert result.stderr.splitlines()[-1] == (
        "manage.py cleanup_runs: error: argument --limit: expected a whole number from 1 to "
        "10,000, not 'abc'")


@pytest.mark.parametrize("args, error", [
    (["cleanup_runs", "--since", "999999999d"],
     "--since: '999999999d' is out of range: give more than 0 and at most 36,500d"),
    (["cleanup_runs", "--since", "9999999999d"],
     "--since: '9999999999d' is out of range: give more than 0 and at most 36,500d"),
    (["cleanup_runs", "--since", "1000000000000m"],
     "--since: '1000000000000m' is out of range: give more than 0 and at most 36,500d"),
    (["cleanup_runs", "--since", "0m"],
     "--since: '0m' is out of range: give more than 0 and at most 36,500d"),
    (["cleanup_runs", "--since", "²d"],
     "--since: expected an ISO-8601 timestamp with offset or an age such as 30m, 6h or 2d "
     "(at most 36,500d), not '²d'"),
    (["cleanup_runs", "--since", "2026-01-01T00:00:00"],
     "--since: expected an ISO-8601 timestamp with offset or an age such as 30m, 6h or 2d "
     "(at most 36,500d), not '2026-01-01T00:00:00' (timestamp 2026-01-01T00:00:00 has no "
     "timezone offset)"),
    (["cleanup_runs", "--limit", "99999999999999999999999999999999"],
     "--limit: expected a whole number from 1 to 10,000, not "
     "'99999999999999999999999999999999'"),
    (["cleanup_runs", "--limit", "0"], "--limit: expected a whole number from 1 to 10,000, "
     "not '0'"),
    (["cleanup_runs", "--limit", "١٢"], "--limit: expected a whole number from 1 to 10,000, "
     "not '١٢'"),
    (["cleanup_chunks", "ffffffff", "--limit", "-1"],
     "--limit: expected a whole number from 1 to 2,147,483,647, not '-1'"),
    (["cleanup_discard", "ffffffff", "--reason", "x", "--chunk", "99999999999"],
     "--chunk: expected a whole number from 1 to 2,147,483,647, not '99999999999'"),
    (["cleanup_replay", "ffffffff", "--chunk", "1_000"],
     "--chunk: expected a whole number from 1 to 2,147,483,647, not '1_000'"),
    (["cleanup_requeue", "ffffffff", "--chunk", "0"],
     "--chunk: expected a whole number from 1 to 2,147,483,647, not '0'"),
    (["run_demo", "--timeout", "nan"],
     "--timeout: expected a duration such as 90s, 30m, 6h or 2d (a bare number is in "
     "seconds), not 'nan'"),
    (["run_demo", "--timeout", "7h"],
     "--timeout: '7h' is out of range: give more than 0 and at most 21,600s"),
    (["run_demo", "--racers", "0"],
     "--racers: expected a whole number from 1 to 100,000, not '0'"),
])
def test_a_number_or_duration_out_of_range_is_refused_in_one_line(args, error):
    with pytest.raises(CommandError) as refused:
        call_command(*args)
    assert str(refused.value) == f"Error: argument {error}"
    assert Run.objects.count() == 0


def test_durations_and_timestamps_in_range_are_taken(expired_leases):
    run = dispatch("expire-leases").run
    for since in ("36500d", "90m", "1.5h", "3600s", "2026-01-01T00:00:00+00:00"):
        assert [r["run_id"] for r in run_json("cleanup_runs", "--since", since)["runs"]] == [
            str(run.pk)], since
    assert run_json("cleanup_runs", "--limit", "10000")["total"] == 1


def test_status_refuses_two_runs_rather_than_showing_one(expired_leases):
    first, second = dispatch("expire-leases").run, dispatch("expire-leases").run
    with pytest.raises(CommandError) as refused:
        call_command("cleanup_status", str(first.pk), "--run", str(second.pk))
    assert str(refused.value) == (f"give one run, not two: RUN_ID '{first.pk}' or --run "
                                  f"'{second.pk}'")
    assert run_json("cleanup_status", "--run", str(second.pk))["run_id"] == str(second.pk)


def test_runs_refuses_an_unknown_policy_as_dispatch_does(db):
    with pytest.raises(CommandError) as listing:
        call_command("cleanup_runs", "--policy", "nope")
    with pytest.raises(CommandError) as dispatching:
        call_command("cleanup_dispatch", "--policy", "nope")
    assert str(listing.value) == str(dispatching.value)
    assert str(listing.value).startswith("unknown policy 'nope' (known: ")
    assert "expire-leases, expire-leases-range, flag-leases, " in str(listing.value)


def test_runs_still_lists_the_runs_of_a_policy_no_longer_registered(db):
    Run.objects.create(policy="retired-rule", dispatch_key="old", cutoff=timezone.now(),
                       scheme="items", trigger="command", planned_all=True)
    assert run_json("cleanup_runs", "--policy", "retired-rule")["total"] == 1


def test_every_command_given_a_short_id_answers_with_the_full_id(dead_letter):
    run_id = str(dead_letter.run_id)
    short = run_id[:8]
    assert run_json("cleanup_status", short)["run_id"] == run_id
    assert run_json("cleanup_chunks", short)["run_id"] == run_id
    assert run_json("cleanup_requeue", short, "--dry-run")["run_id"] == run_id
    # The replay before the requeue: a replay on top of a requeue still in flight is
    # refused (tests/console/test_console_replay.py).
    assert run_json("cleanup_replay", short)["run_id"] == run_id
    assert run_json("cleanup_requeue", short)["run_id"] == run_id
    assert run_json("cleanup_cancel", short, "--noinput")["run_id"] == run_id
    out = StringIO()
    call_command("cleanup_runs", stdout=out)
    assert out.getvalue().splitlines()[1].startswith(f"{run_id}  expire-leases ")


def test_an_unknown_full_or_short_id_is_refused_and_nothing_is_requeued(dead_letter):
    for text in (str(uuid.UUID(int=1)), "00000000"):
        with pytest.raises(CommandError, match=f"^no run with id {text}$"):
            call_command("cleanup_requeue", text)
    assert Chunk.objects.get(pk=dead_letter.pk).state == Chunk.State.DEAD_LETTERED


def test_requeue_of_a_class_dry_run_says_what_it_would_send_and_changes_nothing(dead_letter):
    run_id = str(dead_letter.run_id)
    result = run_json("cleanup_requeue", "--class", "malformed", "--dry-run")
    assert result == {"run_id": None, "failure_class": "malformed", "dry_run": True,
                      "would_requeue": 1, "chunks": {run_id: [1]}, "skipped": 0}
    out = StringIO()
    call_command("cleanup_requeue", "--class", "malformed", "--dry-run", stdout=out)
    assert out.getvalue().splitlines() == [
        "Dry run: would requeue 1 chunk in all runs (class malformed); 0 selected are not "
        "dead-lettered (or their run was cancelled). Nothing changed.",
        f"  run {run_id}: 1 chunk: #1",
    ]
    assert Chunk.objects.get(pk=dead_letter.pk).state == Chunk.State.DEAD_LETTERED
    assert OrmQ.objects.count() == 0


def test_requeue_of_a_class_across_runs_asks_first(dead_letter, monkeypatch):
    questions = []

    def answer(reply):
        def ask(prompt=""):
            questions.append(prompt)
            return reply
        return ask

    monkeypatch.setattr("builtins.input", answer("no"))
    with pytest.raises(CommandError, match="^Cancelled; nothing changed.$"):
        call_command("cleanup_requeue", "--class", "malformed", stdout=StringIO())
    assert questions == ["Requeue 1 dead-lettered chunk of class malformed in 1 run? "
                         "Type 'yes' to go on: "]
    assert (Chunk.objects.get(pk=dead_letter.pk).state, OrmQ.objects.count()) == (
        Chunk.State.DEAD_LETTERED, 0)

    monkeypatch.setattr("builtins.input", answer("yes"))
    assert run_json("cleanup_requeue", "--class", "malformed")["requeued"] == 1
    assert Chunk.objects.get(pk=dead_letter.pk).state == Chunk.State.ENQUEUED


def no_terminal(prompt=""):
    raise EOFError


@pytest.mark.parametrize("args, who", [
    (["cleanup_discard", "RUN", "--chunk", "1", "--reason", "obsolete"], "cleanup_discard"),
    (["cleanup_requeue", "--class", "malformed"], "cleanup_requeue"),
    (["run_demo"], "The demo"),
])
def test_both_prompts_refuse_alike_at_end_of_input(dead_letter, monkeypatch, args, who):
    monkeypatch.setattr("builtins.input", no_terminal)
    args = [str(dead_letter.run_id) if a == "RUN" else a for a in args]
    with pytest.raises(CommandError) as refused:
        call_command(*args, stdout=StringIO())
    assert str(refused.value) == (f"Cancelled; nothing changed (no answer: {who} needs a "
                                  "terminal to confirm, or --noinput).")
    assert (Chunk.objects.get(pk=dead_letter.pk).state, OrmQ.objects.count()) == (
        Chunk.State.DEAD_LETTERED, 0)


class Terminal(StringIO):
    def isatty(self) -> bool:
        return True


def test_under_json_the_question_goes_to_stderr_and_stdout_stays_one_object(dead_letter,
                                                                           monkeypatch):
    monkeypatch.setattr("builtins.input", lambda prompt="": "yes")
    monkeypatch.setattr("sys.stdin", Terminal())
    out, err = StringIO(), StringIO()
    call_command("cleanup_discard", str(dead_letter.run_id), "--chunk", "1", "--reason",
                 "obsolete", "--json", stdout=out, stderr=err)
    assert err.getvalue() == (f"Discard 1 chunk of run {dead_letter.run_id}? Type 'yes' to "
                              "go on: ")
    assert json.loads(out.getvalue())["discarded"] == 1


# transaction=True: the command runs in another process, which must see the dead letter.
@pytest.mark.django_db(transaction=True)
def test_under_json_a_prompt_nobody_can_answer_leaves_one_json_object_on_stderr(account):
    LeaseFactory(account=account, expired=True)
    chunk = dispatch("expire-leases").run.chunks.get()
    apply_chunk({**chunk.message, "version": 99})
    result = subprocess.run(
        [sys.executable, "manage.py", "cleanup_discard", str(chunk.run_id), "--chunk", "1",
         "--reason", "obsolete", "--json"], cwd=ROOT, env=subprocess_env(),
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stdout) == (1, "")
    assert json.loads(result.stderr) == {"error": (
        "Cancelled; nothing changed (no answer: cleanup_discard needs a terminal to "
        "confirm, or --noinput).")}
    assert Chunk.objects.get(pk=chunk.pk).state == Chunk.State.DEAD_LETTERED
