"""The console's one format for states: each known state its own badge, any other value
(one written by hand past the choices) the same unknown badge, wherever it is shown."""

from __future__ import annotations

import pytest
from django.db import connection
from django.template import engines
from django.urls import reverse
from django.utils import timezone

from cleanup import display
from cleanup.console.badges import STATE_COLOURS
from cleanup.engine.dispatch import dispatch
from cleanup.models import Chunk, Slot
from tests.engine_app.factories import LeaseFactory

UNKNOWN = ('<span class="state-badge state-unknown" title="a {} the code does not know">'
           "unknown: {}</span>")


def test_a_known_state_is_a_badge_of_its_own_colour():
    assert display.badge("dead_lettered", "Dead-lettered", known=STATE_COLOURS) == (
        '<span class="state-badge state-dead-lettered" title="Dead-lettered">'
        "Dead-lettered</span>")


def test_a_state_outside_the_known_reads_unknown_whatever_its_label():
    assert (display.badge("lost", "Lost", "a title", known=STATE_COLOURS)
            == UNKNOWN.format("state", "lost"))


def test_an_unknown_badge_says_what_kind_of_value_it_is():
    assert (display.badge("later", "later", known={"fired"}, what="outcome")
            == UNKNOWN.format("outcome", "later"))


def test_the_template_filter_shows_a_state_it_does_not_know_as_unknown():
    template = engines["django"].from_string("{% load cleanup_console %}{{ chunk|state_badge }}")

    assert template.render({"chunk": Chunk(state="lost")}) == UNKNOWN.format("state", "lost")


@pytest.mark.django_db
def test_the_run_pages_chunk_table_shows_a_state_written_by_hand_as_unknown(admin_client,
                                                                          account):
    LeaseFactory.create_batch(2, account=account, expired=True)
    run = dispatch("expire-leases").run
    with connection.cursor() as cursor:
        cursor.execute("UPDATE cleanup_chunk SET state = 'lost' WHERE run_id = %s", [run.pk])

    page = admin_client.get(reverse("admin:cleanup_run_change", args=[run.pk]))

    assert page.status_code == 200
    assert f"<td>{UNKNOWN.format('state', 'lost')}</td>" in page.content.decode()


@pytest.mark.django_db
def test_a_slot_with_an_outcome_written_by_hand_shows_as_unknown(admin_client):
    now = timezone.now()
    Slot.objects.create(policy="expire-leases", slot_at=now, fired_at=now, outcome="later")

    page = admin_client.get(reverse("admin:cleanup_slot_changelist"))

    assert page.status_code == 200
    assert UNKNOWN.format("outcome", "later") in page.content.decode()
