"""Every list and page of the console, the product's admin pages too, answers a value no
query can take (a NUL, a lone surrogate, an id its key cannot hold, a year past four
digits) with 400 before any query, or with the admin's own answer (its "?e=1" page, its
"does not exist" redirect): never a 500. Walked over every registered admin, with every
parameter each list takes."""

from __future__ import annotations

import uuid
from urllib.parse import quote

import pytest
from django.contrib import admin
from django.core.exceptions import BadRequest
from django.db import connection, transaction
from django.http import QueryDict
from django.test.utils import CaptureQueriesContext
from django.urls import NoReverseMatch, resolve, reverse

from cleanup.console.parameters import CheckedRequestsAdmin
from cleanup.console.queue import ReadOnlyTaskAdmin
from cleanup.engine.dispatch import dispatch
from cleanup.models import Chunk, Event, Run
from cleanup.outbox import emit
from reservations.models import SeatHold
from tests.factories import ReminderAttemptFactory

pytestmark = pytest.mark.django_db

# The console's pages, django-q2's task pages it shows in place of its own, and the
# product's.
ADMINS = sorted((model_admin for model, model_admin in admin.site._registry.items()
                 if model._meta.app_label in ("cleanup", "reservations")
                 or isinstance(model_admin, ReadOnlyTaskAdmin)), key=str)
NUL = ["dead%00", "a%00b", "%00"]
# Sent as they are in the query string or the path (percent-encoded).
HOSTILE = [*NUL, "%ED%A0%80", "%FF", "99999999999999999999", "-99999999999999999999", "-1",
           "0", "abc", "1e400", "00000000-0000-0000-0000-000000000000", "%27%3B--"]
# Beside each list's own filters: its search, ordering, page, the admin's error flag
# and facets, and parameters no list takes.
COMMON = ["q", "o", "p", "e", "_facets", "all", "_to_field", "id__in", "nope"]
ANSWERED = {200, 302, 400}


@pytest.fixture
def console(admin_client, dead_letter, expired_holds):
    """Rows on every list: a run and its dead letter, events of two names (the name
    filter lists them), seat holds, a reminder attempt."""
    with transaction.atomic():
        emit("reservations.seat_freed", "seathold:1", {"hold": 1})
        emit("mail.offer", "seathold:2", {"learner": "ada"})
    ReminderAttemptFactory()
    return admin_client


def url_of(model_admin, view: str, *args) -> str:
    opts = model_admin.opts
    return reverse(f"admin:{opts.app_label}_{opts.model_name}_{view}", args=args)


def list_parameters(client, model_admin) -> list[str]:
    """The parameters a list takes: each filter's, its date drill-down's, the common."""
    page = client.get(url_of(model_admin, "changelist"))
    assert page.status_code == 200
    names = list(COMMON)
    for spec in page.context["cl"].filter_specs:
        names += spec.expected_parameters()
    if model_admin.date_hierarchy:
        names += [f"{model_admin.date_hierarchy}__{part}" for part in ("year", "month", "day")]
    if model_admin.opts.model_name == "chunk":
        names += ["run", "run__id__exact", "cause"]  # its lookup_allowed's own
    return names


def answer(client, url: str, value: str) -> int:
    status = client.get(url).status_code
    assert status in ANSWERED, (url, status)
    if value in NUL:
        assert status == 400, url
    return status


def test_every_page_of_the_console_and_the_product_checks_its_requests():
    walked = {str(model_admin) for model_admin in ADMINS}
    assert {"cleanup.EventAdmin", "cleanup.ChunkAdmin", "cleanup.RunAdmin",
            "cleanup.CleanupOverviewAdmin", "reservations.SeatHoldAdmin",
            "django_q.FailureAdmin"} <= walked
    assert [str(model_admin) for model_admin in ADMINS
            if not isinstance(model_admin, CheckedRequestsAdmin)] == []


@pytest.mark.parametrize("model_admin", ADMINS, ids=str)
def test_no_value_of_any_list_parameter_is_a_500(console, model_admin):
    if model_admin.opts.model_name == "cleanupoverview":  # its page takes no parameter
        names = COMMON
    else:
        names = list_parameters(console, model_admin)
    changelist = url_of(model_admin, "changelist")
    for value in HOSTILE:
        answer(console, f"{changelist}?{value}=1", value)
        for name in names:
            answer(console, f"{changelist}?{name}={value}", value)


@pytest.mark.parametrize("model_admin", ADMINS, ids=str)
def test_no_id_in_an_object_pages_url_is_a_500(console, model_admin):
    for view in ("change", "history", "delete"):
        for value in HOSTILE:
            try:
                url = url_of(model_admin, view, "ID").replace("ID", value)
            except NoReverseMatch:  # the overview has no object pages
                continue
            status = console.get(url).status_code
            # A page the admin offers no one (deleting a ledger row) is its 403.
            assert status in ANSWERED | {403, 404}, (url, status)
            if value in NUL:
                assert status == 400, url


def test_the_event_list_filtered_by_a_state_with_a_nul_is_a_400(console):
    assert Event.objects.count() == 2
    assert console.get(reverse("admin:cleanup_event_changelist") + "?state=dead%00"
                       ).status_code == 400


def test_the_event_list_filtered_by_a_name_with_a_nul_is_a_400(console):
    assert Event.objects.count() == 2
    assert console.get(reverse("admin:cleanup_event_changelist") + "?name=a%00b"
                       ).status_code == 400


def test_a_lone_surrogate_is_refused_before_any_query(rf, admin_user):
    # HTTP decoding turns an encoded one into U+FFFD; a caller inside the process can
    # still hand the page one.
    url = reverse("admin:cleanup_event_changelist")
    request = rf.get(url)
    request.user = admin_user
    request.GET = QueryDict(mutable=True)
    request.GET["state"] = "dead\ud800"
    page = resolve(url)

    with CaptureQueriesContext(connection) as queries, pytest.raises(
            BadRequest, match="the query parameter 'state' holds a NUL or a lone surrogate"):
        page.func(request, *page.args, **page.kwargs)
    assert len(queries) == 0


@pytest.mark.parametrize("year", ["99999999999999999999", "-99999999999999999999", "12345"])
def test_a_drill_down_year_past_four_digits_is_a_400_not_an_overflow(console, year):
    url = reverse("admin:reservations_seathold_changelist") + f"?expires_at__year={year}"
    assert console.get(url).status_code == 400


def test_a_drill_down_year_the_admin_can_read_still_lists(console):
    url = reverse("admin:reservations_seathold_changelist") + "?expires_at__year=2026"
    assert console.get(url).status_code == 200


@pytest.mark.parametrize("url", [
    "/admin/cleanup/chunk/dead-letters/?policy=a%00b",
    "/admin/cleanup/cleanupoverview/pause/a%00b/",
    "/admin/cleanup/cleanupoverview/resume/a%00b/",
    "/admin/cleanup/cleanupoverview/blockers/a%00b/",
    "/admin/cleanup/run/a%00b/",
    "/admin/cleanup/event/a%00b/chunk/",
])
def test_a_nul_in_a_console_pages_own_parameter_is_a_400(console, url):
    assert console.get(url).status_code == 400
    assert console.post(url, {"reason": "maintenance"}).status_code == 400


def test_a_nul_in_a_run_pages_chunk_table_parameters_is_a_400(console):
    run = Run.objects.get()
    page = reverse("admin:cleanup_run_change", args=[run.pk])
    assert console.get(page + "?chunk_state=%00").status_code == 400
    assert console.get(page + "?chunks=99999999999999999999").status_code == 200


@pytest.mark.parametrize("value", ["%00", "a%00b"])
def test_a_nul_in_the_autocomplete_search_is_a_400(console, value):
    url = (reverse("admin:autocomplete") + "?app_label=reservations&model_name=seathold"
           f"&field_name=section&term={value}")
    assert console.get(url).status_code == 400


@pytest.mark.parametrize(("changelist", "action", "selected"), [
    ("admin:cleanup_run_changelist", "cancel_runs", "-1"),
    ("admin:cleanup_run_changelist", "replay_runs", "abc"),
    ("admin:cleanup_chunk_changelist", "requeue_chunks", "abc"),
    ("admin:cleanup_chunk_changelist", "discard_chunks", "1e400"),
    ("admin:cleanup_event_changelist", "requeue_events", "1.5"),
    ("admin:cleanup_event_changelist", "discard_events", "a\x00b"),
    ("admin:reservations_seathold_changelist", "delete_selected", "abc"),
])
def test_a_selected_id_its_key_cannot_hold_is_a_400_and_changes_nothing(
        console, changelist, action, selected):
    before = states()
    for step in ({}, {"post": "yes", "reason": "gone"}):
        answered = console.post(reverse(changelist), {
            "action": action, "_selected_action": [selected], **step})
        assert answered.status_code == 400
    assert states() == before


def states() -> list:
    """What the actions above could change."""
    return [sorted(model.objects.values_list("pk", "state" if model is not SeatHold
                                             else "status"))
            for model in (Run, Chunk, Event, SeatHold)]


def test_a_nul_in_a_discard_reason_is_the_forms_refusal_and_discards_nothing(console):
    chunk = Chunk.objects.get()
    answered = console.post(reverse("admin:cleanup_chunk_changelist"), {
        "action": "discard_chunks", "_selected_action": [str(chunk.pk)], "post": "yes",
        "reason": "gone\x00"})

    assert answered.status_code == 200
    assert answered.context["form"].errors["reason"] == ["Null characters are not allowed."]
    assert Chunk.objects.get().state == Chunk.State.DEAD_LETTERED


def test_a_chunk_discard_reason_of_two_lines_is_refused_as_a_pauses_would_be(console):
    chunk = Chunk.objects.get()
    answered = console.post(reverse("admin:cleanup_chunk_changelist"), {
        "action": "discard_chunks", "_selected_action": [str(chunk.pk)], "post": "yes",
        "reason": "gone\nfor good"})

    assert answered.status_code == 200
    assert answered.context["form"].errors["reason"] == [
        "a discard's reason must be one line of printable text; it holds '\\n'"]
    assert Chunk.objects.get().state == Chunk.State.DEAD_LETTERED


@pytest.mark.parametrize("field", ["next", "expected", "select_across", "index", "post"])
def test_a_nul_in_any_other_confirmation_field_is_no_500(console, field):
    chunk = Chunk.objects.get()
    answered = console.post(reverse("admin:cleanup_chunk_changelist"), {
        "action": "discard_chunks", "_selected_action": [str(chunk.pk)], "post": "yes",
        "reason": "gone", "select_across": "1", field: "a\x00b"})
    assert answered.status_code in (200, 302)


def test_selecting_every_run_across_the_list_asks_to_confirm_then_cancels(
        admin_client, expired_leases):
    # The confirmation tells a list that changed since by its highest id: a run's is a
    # UUID, which PostgreSQL has no max() for.
    run = dispatch("expire-leases").run
    runs = reverse("admin:cleanup_run_changelist") + "?work=all"
    data = {"action": "cancel_runs", "select_across": "1", "index": "0",
            "_selected_action": [str(run.pk)]}

    confirmation = admin_client.post(runs, data)
    assert confirmation.status_code == 200 and confirmation.context["count"] == 1
    done = admin_client.post(runs, {**data, "post": "yes",
                                    "expected": confirmation.context["expected"]})

    assert done.status_code == 302
    assert Run.objects.get().state == Run.State.CANCELLED


def test_a_percent_encoded_hostile_value_round_trips_as_text(console):
    # What %ED%A0%80 (an encoded surrogate) becomes: U+FFFD, which PostgreSQL takes.
    url = reverse("admin:cleanup_event_changelist") + "?q=" + quote("seathold:\ufffd")
    assert console.get(url).status_code == 200


@pytest.mark.parametrize(("object_id", "status"), [
    ("-1", 404), ("not-a-uuid", 404), ("a%00b", 400), (str(uuid.uuid4()), 404)])
def test_view_on_site_with_an_id_no_run_can_have_is_no_500(admin_client, object_id, status):
    from django.contrib.contenttypes.models import ContentType

    run_type = ContentType.objects.get_for_model(Run)
    assert admin_client.get(f"/admin/r/{run_type.pk}/{object_id}/").status_code == status
