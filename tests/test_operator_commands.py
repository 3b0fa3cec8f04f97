"""The command-line twins of the console's actions."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django_q.models import OrmQ

from cleanup.dispatch import dispatch
from cleanup.models import Chunk, Run
from cleanup.worker import apply_chunk
from tests.factories import SeatHoldFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def dead_letter(expired_holds) -> Chunk:
    chunk = dispatch("expire-holds").run.chunks.get()
    apply_chunk({**chunk.message, "version": 99})
    OrmQ.objects.all().delete()
    return Chunk.objects.get(pk=chunk.pk)


def run_json(*args) -> dict:
    out = StringIO()
    call_command(*args, "--json", stdout=out)
    return json.loads(out.getvalue())


def test_requeue_sends_dead_letters_once(dead_letter):
    run_id = str(dead_letter.run_id)
    assert run_json("cleanup_requeue", run_id) == {
        "run_id": run_id, "failure_class": None, "requeued": 1, "skipped": 0}
    assert run_json("cleanup_requeue", run_id, "--chunk", "1") == {
        "run_id": run_id, "failure_class": None, "requeued": 0, "skipped": 1}
    assert OrmQ.objects.count() == 1


def test_requeue_one_failure_class_across_runs(dead_letter, section):
    SeatHoldFactory(section=section, expired=True)
    other = dispatch("expire-holds").run.chunks.get()
    Chunk.objects.filter(pk=other.pk).update(state="dead_lettered", failure_class="poison")

    result = run_json("cleanup_requeue", "--class", "malformed")

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


def test_discard_without_confirmation_changes_nothing(dead_letter, monkeypatch):
    monkeypatch.setattr("builtins.input", lambda prompt: "no")
    with pytest.raises(CommandError, match="Cancelled; nothing changed"):
        call_command("cleanup_discard", str(dead_letter.run_id), "--chunk", "1",
                     "--reason", "obsolete")
    assert Chunk.objects.get(pk=dead_letter.pk).state == "dead_lettered"


def test_cancel_twice_is_harmless_and_a_finished_run_is_refused(dead_letter, section):
    SeatHoldFactory(section=section, expired=True)
    run = dispatch("expire-holds").run

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


def test_replay_of_a_cancelled_run_is_refused(section):
    SeatHoldFactory(section=section, expired=True)
    run = dispatch("expire-holds").run
    call_command("cleanup_cancel", str(run.pk), interactive=False, stdout=StringIO())
    with pytest.raises(CommandError, match="is cancelled"):
        call_command("cleanup_replay", str(run.pk))
