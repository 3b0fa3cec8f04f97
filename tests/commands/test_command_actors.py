"""A pause or a resume from the shell names the OS user who ran it, as the console names
the admin user: "paused 2 min by command (alice)" (issue 33)."""

from __future__ import annotations

import getpass
import json
from io import StringIO

import pytest
from django.core.management import call_command

from cleanup.models import Halt

pytestmark = pytest.mark.django_db

POLICY = "expire-leases"


def run_json(*args) -> dict:
    out = StringIO()
    call_command(*args, "--json", stdout=out)
    return json.loads(out.getvalue())


def test_pause_and_resume_name_the_os_user_who_ran_them(monkeypatch):
    monkeypatch.setattr(getpass, "getuser", lambda: "alice")

    paused = run_json("cleanup_pause", "--policy", POLICY, "--reason", "maintenance")
    resumed = run_json("cleanup_resume", "--policy", POLICY)

    assert paused["actor"] == "command (alice)"
    assert paused["described"].endswith(" by command (alice): maintenance")
    assert resumed["ended_by"] == "command (alice)"
    halt = Halt.objects.get()
    assert (halt.actor, halt.ended_by) == ("command (alice)", "command (alice)")


@pytest.mark.parametrize("getuser", [OSError("no login name"), KeyError("uid 4242"), "",
                                     "x" * 200, "bad\nname"],
                         ids=["no-login-name", "no-passwd-entry", "empty", "too-long",
                              "not-one-line"])
def test_without_an_os_user_to_name_the_actor_is_command(monkeypatch, getuser):
    def unknown():
        if isinstance(getuser, Exception):
            raise getuser
        return getuser

    monkeypatch.setattr(getpass, "getuser", unknown)

    paused = run_json("cleanup_pause", "--policy", POLICY, "--reason", "maintenance")
    resumed = run_json("cleanup_resume", "--policy", POLICY)

    assert (paused["actor"], resumed["ended_by"]) == ("command", "command")
