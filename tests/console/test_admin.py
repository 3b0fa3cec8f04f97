"""The operator console through Django's test client: pages, actions, permissions, on the
engine app's leases (the product's own lists are in tests/product/test_product_admin.py)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.urls import reverse
from django.utils import timezone
from django_q.models import OrmQ, Schedule

from cleanup.engine.dispatch import dispatch, dispatch_in_process, preview_dispatch
from cleanup.engine.worker import apply_chunk
from cleanup.models import Chunk, Run, ScheduleInstall
from cleanup.scheduling.schedules import ENGINE_SCHEDULES, NAME_PREFIX, install_schedules
from tests.engine_app.factories import LeaseFactory, LeaseLogFactory
from tests.engine_app.models import Lease

pytestmark = pytest.mark.django_db

RUNS = reverse("admin:cleanup_run_changelist")
CHUNKS = reverse("admin:cleanup_chunk_changelist")
OVERVIEW = reverse("admin:cleanup_cleanupoverview_changelist")
DISPATCH = reverse("admin:cleanup_run_dispatch")


def staff(client, *perms: str) -> User:
    user = User.objects.create_user("op", password="pw", is_staff=True)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(content_type__app_label="cleanup",
                                                         codename=codename))
    client.force_login(user)
    return user


@pytest.fixture
def support(client):
    """A support role that may only view runs and chunks."""
    staff(client, "view_run", "view_chunk")
    return client


def action(client, url, name, pks, **extra):
    return client.post(url, {"action": name, "_selected_action": [str(p) for p in pks],
                             **extra}, follow=True)


def texts(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


# Pages


def test_run_list_shows_progress_counts_and_trigger(admin_client, dead_letter):
    replayed = dispatch("expire-leases", key="again").run
    Run.objects.filter(pk=replayed.pk).update(replay_of=dead_letter.run, trigger="replay")

    page = admin_client.get(RUNS).content.decode()

    assert '<progress value="0" max="1"></progress> 0/1' in page
    assert "Replay of run" in page and str(dead_letter.run_id)[:8] in page
    # A short label in the list, the full state as its title.
    assert 'title="Completed with dead letters"' in page and ">Dead letters</span>" in page


def test_run_page_is_read_only_with_a_paginated_chunk_table(admin_client, expired_leases,
                                                            account, chunk_size, settings):
    chunk_size("expire-leases", 1)
    settings.CLEANUP_WINDOW = 100  # every chunk planned at once
    LeaseFactory.create_batch(55, account=account, expired=True)
    run = dispatch("expire-leases").run
    url = reverse("admin:cleanup_run_change", args=[run.pk])

    first, second = admin_client.get(url), admin_client.get(url + "?chunks=2")

    assert "Chunks (60)" in first.content.decode()
    assert "page 1 of 2" in first.content.decode()
    assert "page 2 of 2" in second.content.decode()
    assert 'name="_save"' not in first.content.decode()
    assert admin_client.post(url, {"state": "completed"}).status_code == 403
    run.refresh_from_db()
    assert run.state == Run.State.RUNNING


def test_ledger_rows_cannot_be_added_or_deleted(admin_client, dead_letter):
    assert admin_client.get(reverse("admin:cleanup_run_add")).status_code == 403
    assert admin_client.get(reverse("admin:cleanup_chunk_add")).status_code == 403
    delete = reverse("admin:cleanup_chunk_delete", args=[dead_letter.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert Chunk.objects.filter(pk=dead_letter.pk).exists()


def test_chunk_page_shows_message_as_sent_and_error(admin_client, dead_letter):
    page = admin_client.get(reverse("admin:cleanup_chunk_change", args=[dead_letter.pk]))
    content = page.content.decode()
    assert "&quot;run_id&quot;: &quot;" + str(dead_letter.run_id) in content
    assert "unknown message version 99" in content


def test_chunk_list_filters_dead_letters_first(admin_client, dead_letter):
    page = admin_client.get(CHUNKS + "?state=dead_lettered")
    assert list(page.context["cl"].queryset) == [dead_letter]
    choices = [c["display"] for c in page.context["cl"].filter_specs[0].choices(
        page.context["cl"])]
    assert choices[:2] == ["All", "Dead-lettered"]


def test_admin_index_links_the_cleanup_overview(admin_client):
    page = admin_client.get(reverse("admin:index")).content.decode()
    assert f'href="{OVERVIEW}"' in page and "Cleanup overview" in page


def test_overview_tells_missed_schedule_apart_from_stalled_work(admin_client, settings,
                                                                expire_leases_scheduled,
                                                                dead_letter):
    install_schedules()
    page = admin_client.get(OVERVIEW).content.decode()
    assert "Missed schedule" not in page  # just installed: nothing was due yet
    # Installed ten minutes ago and the scheduler has fired nothing since.
    ScheduleInstall.objects.update(installed_at=timezone.now() - timedelta(minutes=10))
    page = admin_client.get(OVERVIEW).content.decode()
    assert "Missed schedule" in page and "Stalled work" not in page
    ScheduleInstall.objects.update(installed_at=timezone.now())

    settings.CLEANUP_SCHEDULE_GRACE_SECONDS = 3600
    stuck = dispatch("expire-leases", key="stuck").run
    LeaseFactory(expired=True)
    Chunk.objects.filter(run=stuck).update(planned_at=timezone.now() - timedelta(hours=1))
    stalled = dispatch("expire-leases", key="stalled").run
    Chunk.objects.filter(run=stalled).update(
        planned_at=timezone.now() - timedelta(hours=1),
        enqueued_at=timezone.now() - timedelta(hours=1))
    page = admin_client.get(OVERVIEW).content.decode()
    assert "Stalled work" in page and "Missed schedule" not in page


def test_overview_needs_view_permission(client):
    staff(client)
    assert client.get(OVERVIEW).status_code == 403


# Permissions


def test_support_role_sees_runs_and_chunks_but_is_offered_no_action(support, dead_letter):
    runs, chunks = support.get(RUNS), support.get(CHUNKS)
    assert runs.status_code == chunks.status_code == 200
    assert support.get(OVERVIEW).status_code == 200
    for page in (runs, chunks):
        assert page.context["action_form"] is None


def test_forged_action_post_changes_nothing(support, dead_letter):
    action(support, CHUNKS, "requeue_chunks", [dead_letter.pk])
    action(support, RUNS, "cancel_runs", [dead_letter.run_id], post="yes")
    dead_letter.refresh_from_db()
    assert dead_letter.state == Chunk.State.DEAD_LETTERED
    assert OrmQ.objects.count() == 0
    assert dead_letter.run.state == Run.State.COMPLETED_WITH_DEAD_LETTERS


def test_project_views_answer_403_without_permission(support, dead_letter):
    replay_url = reverse("admin:cleanup_run_replay", args=[dead_letter.run_id])
    assert support.get(DISPATCH).status_code == 403
    assert support.post(DISPATCH, {"policy": "expire-leases", "_confirm": "1"}).status_code == 403
    assert support.post(replay_url, {"cutoff": timezone.now().isoformat(),
                                     "_confirm": "1"}).status_code == 403
    assert Run.objects.count() == 1


def test_permission_offers_only_its_own_action(client, dead_letter):
    staff(client, "view_chunk", "requeue")
    choices = [c[0] for c in client.get(CHUNKS).context["action_form"].fields["action"].choices]
    assert choices == ["", "requeue_chunks"]


# Actions


def test_requeue_from_two_stale_tabs_sends_once(admin_client, dead_letter):
    first = action(admin_client, CHUNKS, "requeue_chunks", [dead_letter.pk], post="yes")
    second = action(admin_client, CHUNKS, "requeue_chunks", [dead_letter.pk], post="yes")

    assert texts(first) == ["1 chunk requeued."]
    assert texts(second) == ["0 chunks requeued.",
                             "1 chunks were not dead-lettered (or their run was cancelled) "
                             "and were left alone."]
    dead_letter.refresh_from_db()
    assert dead_letter.state == Chunk.State.ENQUEUED
    assert dead_letter.run.state == Run.State.RUNNING
    assert OrmQ.objects.count() == 1
    entry = LogEntry.objects.get()
    assert (entry.user.username, entry.change_message) == ("admin", "Requeued")


def test_discard_asks_for_a_reason_then_discards(admin_client, dead_letter):
    confirm = action(admin_client, CHUNKS, "discard_chunks", [dead_letter.pk])
    assert "Discard chunks" in confirm.content.decode()
    blank = action(admin_client, CHUNKS, "discard_chunks", [dead_letter.pk], post="yes",
                   reason="  ")
    assert "This field is required" in blank.content.decode()
    dead_letter.refresh_from_db()
    assert dead_letter.state == Chunk.State.DEAD_LETTERED

    done = action(admin_client, CHUNKS, "discard_chunks", [dead_letter.pk], post="yes",
                  reason="leases were purged by hand")

    assert texts(done) == ["1 chunk discarded."]
    dead_letter.refresh_from_db()
    assert (dead_letter.state, dead_letter.discard_reason) == ("discarded",
                                                               "leases were purged by hand")
    assert dead_letter.run.state == Run.State.COMPLETED


def test_cancel_confirms_then_cancels_and_skips_finished_runs(admin_client, expired_leases,
                                                              dead_letter):
    LeaseFactory(expired=True)
    running = dispatch("expire-leases").run
    pks = [running.pk, dead_letter.run_id]

    confirm = action(admin_client, RUNS, "cancel_runs", pks)
    assert "Cancel runs" in confirm.content.decode()
    assert Run.objects.get(pk=running.pk).state == Run.State.RUNNING

    done = action(admin_client, RUNS, "cancel_runs", pks, post="yes")

    assert texts(done) == ["1 run cancelled.", "1 runs were not running and were left alone."]
    assert Run.objects.get(pk=running.pk).state == Run.State.CANCELLED
    assert set(running.chunks.values_list("state", flat=True)) == {"cancelled"}
    assert apply_chunk(running.chunks.get().message) == "noop"


def test_replay_chunks_and_runs_resend_messages(admin_client, dead_letter):
    confirm = action(admin_client, CHUNKS, "replay_chunks", [dead_letter.pk])
    assert "Replay chunks" in confirm.content.decode()
    assert OrmQ.objects.count() == 0
    action(admin_client, CHUNKS, "replay_chunks", [dead_letter.pk], post="yes")
    assert OrmQ.objects.count() == 1
    apply_chunk(dead_letter.message)
    assert Lease.objects.count() == 0

    confirm = action(admin_client, RUNS, "replay_runs", [dead_letter.run_id])
    assert "Replay runs" in confirm.content.decode()
    assert OrmQ.objects.count() == 1  # the chunk replay's message only
    response = action(admin_client, RUNS, "replay_runs", [dead_letter.run_id], post="yes")
    assert texts(response) == ["1 chunk re-sent."]
    assert OrmQ.objects.count() == 2
    assert apply_chunk(dead_letter.message) == "noop"


def test_replay_with_new_cutoff_previews_then_creates_one_linked_run(admin_client,
                                                                     dead_letter):
    url = reverse("admin:cleanup_run_replay", args=[dead_letter.run_id])
    future = (timezone.now() + timedelta(hours=1)).isoformat()
    before = (dead_letter.run.cutoff - timedelta(hours=1)).isoformat()
    assert "in the future" in admin_client.post(url, {"cutoff": future,
                                                      "_preview": "1"}).content.decode()
    assert "before the original" in admin_client.post(url, {"cutoff": before,
                                                            "_preview": "1"}).content.decode()
    assert "not an ISO-8601" in admin_client.post(url, {"cutoff": "soon",
                                                        "_preview": "1"}).content.decode()
    LeaseFactory(expired=True)
    cutoff = timezone.now().isoformat()

    page = admin_client.post(url, {"cutoff": cutoff, "_preview": "1"})
    assert Run.objects.count() == 1
    assert page.context["preview"].rows == 6
    assert "6</strong> rows" in page.content.decode()

    first = admin_client.post(url, {"cutoff": cutoff, "_confirm": "1"}, follow=True)
    second = admin_client.post(url, {"cutoff": cutoff, "_confirm": "1"}, follow=True)

    new = Run.objects.exclude(pk=dead_letter.run_id).get()
    assert new.replay_of_id == dead_letter.run_id
    assert texts(first)[0].startswith(f"Started run {new.pk}")
    assert "had already been started" in texts(second)[0]
    assert LogEntry.objects.filter(object_id=str(new.pk)).count() == 1


def test_dispatch_now_previews_then_confirms_once(admin_client, expired_leases):
    page = admin_client.post(DISPATCH, {"policy": "expire-leases", "_preview": "1"})
    key = page.context["confirm_key"]
    cutoff = page.context["preview_cutoff"]
    assert page.context["preview"].rows_by_partition == {"whole table": 5}
    assert Run.objects.count() == 0

    form = {"policy": "expire-leases", "cutoff": cutoff, "confirm_key": key, "_confirm": "1"}
    first = admin_client.post(DISPATCH, form, follow=True)
    second = admin_client.post(DISPATCH, form, follow=True)

    run = Run.objects.get()
    assert (run.trigger, run.cutoff.isoformat(), run.candidates) == ("admin", cutoff, 5)
    # The operator reads what the command would print: rows eligible, what was planned.
    assert texts(first) == [f"Dispatched run {run.pk} of expire-leases (items, cutoff "
                            f"{run.cutoff:%Y-%m-%d %H:%M:%S} UTC): 5 rows eligible; 1 chunk "
                            "planned (5 rows)."]
    assert texts(second) == [f"Run {run.pk} had already been started; nothing new was sent."]


def test_dispatch_now_refuses_tampered_values(admin_client, expired_leases):
    tampered = admin_client.post(DISPATCH, {"policy": "expire-leases", "confirm_key": "x",
                                            "_confirm": "1"})
    unknown = admin_client.post(DISPATCH, {"policy": "nope", "_preview": "1"})
    assert "tampered" in tampered.content.decode()
    assert "Select a valid choice" in unknown.content.decode()
    assert Run.objects.count() == 0


def test_replay_view_of_unknown_run_redirects_with_a_message(admin_client):
    url = reverse("admin:cleanup_run_replay", args=["00000000-0000-0000-0000-000000000000"])
    response = admin_client.get(url, follow=True)
    assert texts(response) == ["No run with id 00000000-0000-0000-0000-000000000000."]


def test_schedule_rows_are_untouched_by_the_console(admin_client, expire_leases_scheduled):
    install_schedules()
    installed = list(Schedule.objects.order_by("pk").values())
    admin_client.get(OVERVIEW)
    assert list(Schedule.objects.order_by("pk").values()) == installed
    # The engine's own three and the one scheduled policy; the rows a host adds beside
    # them (the product's, in these settings) are no concern of the engine's.
    assert {row["name"] for row in installed} >= {
        f"{NAME_PREFIX}expire-leases", *(NAME_PREFIX + name for name in ENGINE_SCHEDULES)}


def test_a_run_still_planning_shows_how_far_it_has_got(admin_client, account, settings,
                                                        chunk_size):
    settings.CLEANUP_WINDOW = 2
    chunk_size("expire-leases", 1)
    LeaseFactory.create_batch(6, account=account, expired=True)
    run = dispatch("expire-leases", scheme="range").run

    page = admin_client.get(reverse("admin:cleanup_run_change", args=[run.pk])).content.decode()
    listing = admin_client.get(reverse("admin:cleanup_run_changelist")).content.decode()

    assert "planning as chunks finish" in page and "through its span" in page
    assert "0/2+" in listing  # two planned so far, more to come


def test_the_preview_is_the_dispatch_dry_run_named_for_the_partition(admin_client, account):
    LeaseLogFactory.create_batch(3, account=account, stale=True)
    page = admin_client.post(DISPATCH, {"policy": "purge-lease-logs", "_preview": "1"})

    dry = preview_dispatch("purge-lease-logs")
    assert page.context["preview"] == dry.preview
    assert page.context["preview"].rows_by_partition == {account.pk: 3}
    assert "<th>Account</th>" in page.content.decode()
    whole = admin_client.post(DISPATCH, {"policy": "expire-leases", "_preview": "1"})
    assert "<th>Partition</th>" in whole.content.decode()


def test_an_update_run_shows_rows_updated_on_its_page_and_in_the_lists(admin_client, account):
    LeaseFactory.create_batch(2, account=account, expired=True)  # each one's notice due
    run = dispatch_in_process("flag-leases").run
    page = admin_client.get(reverse("admin:cleanup_run_change", args=[run.pk])).content.decode()
    assert "<th>Rows updated</th>" in page and "<th>Rows deleted</th>" not in page
    assert '<th class="number">Updated</th>' in page
    listing = admin_client.get(RUNS).content.decode()
    assert "column-rows_changed" in listing
    chunk = run.chunks.get()
    chunks = admin_client.get(reverse("admin:cleanup_chunk_changelist")).content.decode()
    assert re.search(r'class="field-changed">2<', chunks), chunks
    assert chunk.rows_changed == chunk.rows_updated == 2
