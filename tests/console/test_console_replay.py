"""Replaying a whole run is confirmed first, and a second replay while the first one's
chunks are still in flight is refused, from the console and from the command alike: a
double submit re-sent every chunk twice (issue 33: 327 messages for 109 chunks)."""

from __future__ import annotations

import subprocess
import sys
import threading
from io import StringIO

import pytest
from django.contrib.admin.models import LogEntry
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.urls import reverse
from django_q.models import OrmQ

from cleanup.engine.dispatch import dispatch
from cleanup.engine.replay import replay
from cleanup.engine.worker import apply_chunk
from cleanup.exceptions import CleanupError
from cleanup.models import Chunk, Run
from tests.conftest import ROOT, subprocess_env
from tests.engine_app.factories import LeaseFactory

pytestmark = pytest.mark.django_db

RUNS = reverse("admin:cleanup_run_changelist")
IN_FLIGHT = "was re-sent before and 6 of the chunks to replay are still in flight"


@pytest.fixture
def run(account, chunk_size, settings) -> Run:
    """A run of 6 one-row chunks, all sent at dispatch, half of them dead-lettered since;
    the queue emptied (the first messages were delivered)."""
    chunk_size("expire-leases", 1)
    settings.CLEANUP_WINDOW = 100
    LeaseFactory.create_batch(6, account=account, expired=True)
    run = dispatch("expire-leases").run
    Chunk.objects.filter(run=run, chunk_id__lte=3).update(
        state=Chunk.State.DEAD_LETTERED, failure_class=Chunk.FailureClass.POISON)
    OrmQ.objects.all().delete()
    return run


def replay_runs(client, pks: list, **extra):
    return client.post(RUNS, {"action": "replay_runs",
                              "_selected_action": [str(pk) for pk in pks], **extra},
                       follow=True)


def messages_of(response) -> list[tuple[str, str]]:
    return [(m.level_tag, str(m)) for m in response.context["messages"]]


def test_replaying_runs_from_the_console_asks_first_and_sends_nothing_until_confirmed(
        admin_client, run):
    page = replay_runs(admin_client, [run.pk])

    content = page.content.decode()
    assert "Replay runs" in content and 'name="post" value="yes"' in content
    assert f"expire-leases run {run.pk}" in content  # the run it will replay
    assert OrmQ.objects.count() == 0
    assert run.chunks.filter(state=Chunk.State.DEAD_LETTERED).count() == 3


def test_a_double_submitted_replay_sends_each_chunk_once_and_says_why_not_twice(
        admin_client, run):
    first = replay_runs(admin_client, [run.pk], post="yes")
    second = replay_runs(admin_client, [run.pk], post="yes")

    assert messages_of(first) == [("success", "6 chunks re-sent.")]
    assert OrmQ.objects.count() == 6
    [refusal, summary] = messages_of(second)
    assert refusal[0] == "error" and refusal[1].startswith(f"run {run.pk} {IN_FLIGHT} "
                                                           "(6 enqueued)")
    assert summary == ("warning", "0 chunks re-sent.")
    run.refresh_from_db()
    assert run.messages_sent == 12  # 6 at dispatch, 6 by the one replay
    assert LogEntry.objects.filter(object_id=str(run.pk)).count() == 1


def test_a_run_refused_for_chunks_in_flight_does_not_hold_back_the_others(
        admin_client, run):
    replay(run.pk)
    OrmQ.objects.all().delete()
    other = dispatch("expire-leases", key="other").run  # 6 chunks, every one committed
    for message in queued_messages():
        apply_chunk(message)
    OrmQ.objects.all().delete()

    response = replay_runs(admin_client, [run.pk, other.pk], post="yes")

    refusals = [text for level, text in messages_of(response) if level == "error"]
    assert len(refusals) == 1 and refusals[0].startswith(f"run {run.pk} {IN_FLIGHT}")
    assert ("success", "6 chunks re-sent.") in messages_of(response)
    assert {m["run_id"] for m in queued_messages()} == {str(other.pk)}


def test_once_the_replayed_chunks_have_finished_the_run_can_be_replayed_again(run):
    replay(run.pk)
    for message in queued_messages():
        apply_chunk(message)
    OrmQ.objects.all().delete()

    again = replay(run.pk)

    assert again.resent == OrmQ.objects.count() == 6  # committed: each a no-op
    assert {apply_chunk(m) for m in queued_messages()} == {"noop"}


def test_the_first_replay_of_a_run_never_re_sent_is_not_refused(run):
    """Chunks still enqueued from the dispatch alone (their messages lost) are re-sent:
    the refusal is for a re-send on top of a re-send."""
    assert replay(run.pk).resent == 6


def test_the_command_refuses_a_second_replay_while_the_first_is_in_flight(run):
    call_command("cleanup_replay", str(run.pk), stdout=StringIO())
    states = dict(run.chunks.values_list("chunk_id", "state"))

    with pytest.raises(CommandError, match=f"run {run.pk} {IN_FLIGHT}"):
        call_command("cleanup_replay", str(run.pk), stdout=StringIO())
    with pytest.raises(CommandError, match="2 of the chunks to replay are still in flight"):
        call_command("cleanup_replay", str(run.pk), "--chunk", "1", "--chunk", "5",
                     stdout=StringIO())

    assert OrmQ.objects.count() == 6
    run.refresh_from_db()
    assert run.messages_sent == 12
    assert dict(run.chunks.values_list("chunk_id", "state")) == states


@pytest.mark.django_db(transaction=True)  # the command runs in a process of its own
def test_from_the_shell_the_refusal_is_one_line_and_exits_non_zero(run):
    replay(run.pk)

    result = subprocess.run([sys.executable, "manage.py", "cleanup_replay", str(run.pk)],
                            cwd=ROOT, env=subprocess_env(), capture_output=True, text=True,
                            timeout=120)

    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"CommandError: run {run.pk} {IN_FLIGHT} (6 enqueued)")
    assert OrmQ.objects.count() == 6


@pytest.mark.django_db(transaction=True)  # two replays on two real connections at once
def test_two_replays_at_once_send_the_run_once(run):
    """The second waits for the first to commit, then sees what it sent."""
    first_sent, release, outcome = threading.Event(), threading.Event(), {}

    def first_replay():
        try:
            with transaction.atomic():
                outcome["first"] = replay(run.pk).resent
                first_sent.set()
                release.wait(30)  # still uncommitted while the second one starts
        finally:
            connection.close()

    def second_replay():
        try:
            outcome["second"] = replay(run.pk).resent
        except CleanupError as exc:
            outcome["second"] = str(exc)
        finally:
            connection.close()

    first = threading.Thread(target=first_replay)
    first.start()
    assert first_sent.wait(30)
    second = threading.Thread(target=second_replay)
    second.start()
    second.join(2)
    waited = second.is_alive()
    release.set()
    first.join(30)
    second.join(30)

    assert waited, outcome  # it waited for the first replay to commit
    assert outcome["first"] == 6
    assert IN_FLIGHT in outcome["second"]
    assert OrmQ.objects.count() == 6


def queued_messages() -> list[dict]:
    return [task.task["args"][0] for task in OrmQ.objects.order_by("id")]
