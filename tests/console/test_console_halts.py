"""Pause and resume from the overview: a form for the reason, a permission of their
own, and the overview saying who paused what and why."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from cleanup.engine import halts
from cleanup.models import Halt
from tests.console.test_security import login

pytestmark = pytest.mark.django_db
POLICY = "expire-leases"
OVERVIEW = reverse("admin:cleanup_cleanupoverview_changelist")
PAUSE = reverse("admin:cleanup_policy_pause", args=[POLICY])
RESUME = reverse("admin:cleanup_policy_resume", args=[POLICY])


def test_an_operator_pauses_with_a_reason_and_resumes_from_the_overview(admin_client):
    page = admin_client.get(OVERVIEW).content.decode()
    assert f'href="{PAUSE}"' in page

    form = admin_client.get(PAUSE)
    assert form.status_code == 200 and b'name="reason"' in form.content
    done = admin_client.post(PAUSE, {"reason": "index rebuild"}, follow=True)
    assert done.redirect_chain[-1][0] == OVERVIEW
    halt = Halt.objects.get(policy=POLICY, ended_at__isnull=True)
    assert (halt.detail, halt.actor) == ("index rebuild", "admin")
    page = done.content.decode()
    assert f"Paused {POLICY}: nothing new is planned until it is resumed." in page
    assert "paused" in page and "by admin: index rebuild" in page
    assert f'href="{RESUME}"' in page and f'href="{PAUSE}"' not in page

    done = admin_client.post(RESUME, follow=True)
    assert f"Resumed {POLICY} after it was paused" in done.content.decode()
    halt.refresh_from_db()
    assert halt.ended_by == "admin" and halt.ended_at is not None


def test_a_pause_without_a_reason_is_refused_with_nothing_changed(admin_client):
    response = admin_client.post(PAUSE, {"reason": ""})
    assert response.status_code == 200 and b"This field is required." in response.content
    assert not Halt.objects.exists()


def test_an_unknown_policy_is_refused_with_its_error(admin_client):
    url = reverse("admin:cleanup_policy_pause", args=["nope"])
    page = admin_client.post(url, {"reason": "x"}, follow=True).content.decode()
    assert "Unknown policy &#x27;nope&#x27; (known: " in page
    assert not Halt.objects.exists()


@pytest.mark.parametrize("role", ["support", "dispatch", "cancel"])
def test_pausing_needs_the_pause_permission(client, role):
    login(client, role)
    assert client.get(PAUSE).status_code == 403
    assert client.post(PAUSE, {"reason": "x"}).status_code == 403
    assert client.post(RESUME).status_code == 403
    assert f'href="{PAUSE}"' not in client.get(OVERVIEW).content.decode()
    assert not Halt.objects.exists()


def test_the_pause_permission_alone_pauses_and_resumes(client):
    user = User.objects.create_user("pauser", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(
        content_type__app_label="cleanup", codename__in=["view_run", "pause"]))
    client.force_login(user)
    client.post(PAUSE, {"reason": "vacuum full tonight"})
    assert halts.open_halts(POLICY)[0].actor == "pauser"
    client.post(RESUME)
    assert not halts.open_halts(POLICY)


BAD_REASONS = [
    pytest.param("x" * 100_000, "a pause's reason is at most 500 characters (this one has "
                 "100,000)", id="100 KB"),
    pytest.param("index\x00rebuild", "a pause's reason must be one line of printable text; "
                 "it holds '\\x00'", id="a NUL"),
    pytest.param("index\nrebuild", "a pause's reason must be one line of printable text; "
                 "it holds '\\n'", id="two lines"),
]


@pytest.mark.parametrize("reason, refusal", BAD_REASONS)
def test_one_limit_and_one_validation_for_a_pause_from_the_command_and_the_console(
        admin_client, reason, refusal):
    from io import StringIO

    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError) as refused:
        call_command("cleanup_pause", "--policy", POLICY, "--reason", reason,
                     stdout=StringIO(), stderr=StringIO())
    assert refusal in str(refused.value)

    page = admin_client.post(PAUSE, {"reason": reason})
    assert page.status_code == 200  # the form again, with the reason refused
    assert page.context["form"].errors["reason"]
    assert not Halt.objects.exists()
