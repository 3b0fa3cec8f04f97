"""The halts of a policy a deploy removed while it was halted: nothing plans for it any
more, but its halts stay open and ``cleanup_policy_held`` reads 1 for it (so
CleanupHeldTooLong fires) until an operator ends them. The status, the policy list and
the overview name them, say the policy is gone and how to end them; the overview's
Resume ends them."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from cleanup.engine import operations
from cleanup.engine.dispatch import dispatch
from cleanup.models import Halt
from cleanup.observability.overview import gone_policies
from tests.observability.test_metrics import scrape

pytestmark = pytest.mark.django_db
GHOST = "ghost-policy"
OVERVIEW = reverse("admin:cleanup_cleanupoverview_changelist")
RESUME_GHOST = reverse("admin:cleanup_policy_resume", args=[GHOST])
HELD = frozenset({"policy": GHOST, "reason": "paused"}.items())
# What the commands print for the ghost's two halts, after whatever else they say.
GHOST_LINES = [
    f"{GHOST} is no longer registered (removed by a deploy) and is still halted:",
    "  paused 2.0 h by alice: migration",
    "  halted 1.0 h: standby 40 s behind",
    f"  end it with: manage.py cleanup_resume --policy {GHOST}",
]


@pytest.fixture
def ghost(db) -> list[Halt]:
    """A pause (two hours old) and a pressure halt (one) of a policy no registry names."""
    now = timezone.now()
    return [
        Halt.objects.create(policy=GHOST, reason=Halt.PAUSED, detail="migration",
                            actor="alice", began_at=now - timedelta(hours=2)),
        Halt.objects.create(policy=GHOST, reason="replica_lag", detail="standby 40 s behind",
                            actor="engine", began_at=now - timedelta(hours=1)),
    ]


def command(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_status_names_the_gone_policys_halts_and_the_command_that_ends_them(
        ghost, expired_holds):
    run = dispatch("expire-holds").run

    lines = command("cleanup_status").splitlines()
    result = json.loads(command("cleanup_status", "--json"))

    assert lines[0].startswith(f"Run {run.pk} (expire-holds, ")
    assert lines[-5:] == ["", *GHOST_LINES]
    assert result["run_id"] == str(run.pk)
    [gone] = result["gone_policy_halts"]
    assert (gone["policy"], gone["resume_command"]) == (
        GHOST, f"manage.py cleanup_resume --policy {GHOST}")
    assert [(halt["reason"], halt["described"], halt["ended_at"]) for halt in gone["halts"]] == [
        ("paused", "paused 2.0 h by alice: migration", None),
        ("replica_lag", "halted 1.0 h: standby 40 s behind", None)]


def test_the_policy_list_ends_with_the_gone_policys_halts(ghost):
    text = command("cleanup_policies")
    result = json.loads(command("cleanup_policies", "--json"))

    assert text.rstrip("\n").split("\n\n")[-1].splitlines() == GHOST_LINES
    assert GHOST not in [policy["policy"] for policy in result["policies"]]
    assert [gone["policy"] for gone in result["gone_policy_halts"]] == [GHOST]


def test_a_registered_policys_pause_and_an_ended_gone_halt_are_not_listed_as_gone(db):
    operations.pause_policy("expire-leases", "maintenance", actor="alice")
    Halt.objects.create(policy=GHOST, reason=Halt.PAUSED, detail="migration",
                        ended_at=timezone.now(), ended_by="bob")

    assert json.loads(command("cleanup_policies", "--json"))["gone_policy_halts"] == []
    assert "no longer registered" not in command("cleanup_policies")


def test_the_halts_of_every_gone_policy_are_read_in_one_query(
        ghost, django_assert_num_queries):
    Halt.objects.create(policy="another-ghost", reason=Halt.PAUSED, detail="gone too")

    with django_assert_num_queries(1):
        gone = gone_policies()

    assert [(policy.policy, len(policy.halted)) for policy in gone] == [
        ("another-ghost", 1), (GHOST, 2)]


def test_the_overview_shows_the_gone_policy_its_halts_and_how_to_end_them(
        admin_client, ghost):
    response = admin_client.get(OVERVIEW)
    page = response.content.decode()

    alerts = {(alert.title, alert.policy): alert.detail for alert in response.context["alerts"]}
    assert alerts["Halted, and no longer registered", GHOST] == (
        "paused 2.0 h by alice: migration; halted 1.0 h: standby 40 s behind; the policy was "
        f"removed by a deploy: end it with manage.py cleanup_resume --policy {GHOST}")
    table = page[page.index('id="gone-policies"'):]
    assert f'<strong class="policy-name">{GHOST}</strong>' in table
    assert "no longer registered (removed by a deploy)" in table
    assert '<span class="halted">paused 2.0 h by alice: migration</span>' in table
    assert f"<code>manage.py cleanup_resume --policy {GHOST}</code>" in table
    assert f'href="{RESUME_GHOST}"' in table


def test_the_overviews_resume_ends_a_gone_policys_halts_and_its_halted_gauge(
        admin_client, client, ghost):
    assert scrape(client)["cleanup_policy_held", HELD] == 1
    form = admin_client.get(RESUME_GHOST).content.decode()
    assert f"<strong>{GHOST}</strong> is no longer registered (a deploy removed it)" in form

    done = admin_client.post(RESUME_GHOST, follow=True)

    assert done.redirect_chain[-1][0] == OVERVIEW
    assert (f"Ended the halts of {GHOST}, which is no longer registered; it was paused 2.0 h "
            "by alice: migration.") in done.content.decode()
    assert not Halt.objects.filter(policy=GHOST, ended_at__isnull=True).exists()
    assert set(Halt.objects.values_list("ended_by", flat=True)) == {"admin"}
    assert ("cleanup_policy_held", HELD) not in scrape(client)
    assert 'id="gone-policies"' not in done.content.decode()


def test_the_overviews_resume_ends_nothing_for_a_name_with_no_halt_open(admin_client, ghost):
    """A forged name is the unknown policy it is; the gone policy's halts stay listed."""
    forged = reverse("admin:cleanup_policy_resume", args=["forged-policy"])

    form = admin_client.get(forged).content.decode()
    page = admin_client.post(forged, follow=True).content.decode()

    assert "no longer registered" not in form
    assert "Unknown policy &#x27;forged-policy&#x27; (known: " in page
    assert 'id="gone-policies"' in page and f'href="{RESUME_GHOST}"' in page
    assert list(Halt.objects.values_list("policy", "ended_at")) == [(GHOST, None)] * 2
