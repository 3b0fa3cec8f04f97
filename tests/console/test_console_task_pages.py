"""django-q2's own task pages stay readable beside the console, but nothing resubmits,
changes or deletes a chunk's task there: that path went around the console's
confirmations and its ledger (issue 33)."""

from __future__ import annotations

import traceback
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.db import IntegrityError
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape
from django_q.models import Failure, OrmQ, Success

from cleanup.console.queue import error_line
from cleanup.engine.dispatch import dispatch
from cleanup.engine.transport import CHUNK_TASK
from cleanup.engine.worker import apply_chunk
from cleanup.models import Chunk

pytestmark = pytest.mark.django_db

FAILED = reverse("admin:django_q_failure_changelist")
SUCCEEDED = reverse("admin:django_q_success_changelist")
QUEUED = reverse("admin:django_q_ormq_changelist")


# PostgreSQL's refusal, its first line longer than django-q2's 100-character cut.
REFUSAL = ('update or delete on table "reservations_section" violates foreign key '
           'constraint "reservations_seathold_section_id_fk" on table "reservations_seathold"\n'
           'DETAIL:  Key (id)=(4211) is still referenced from table "reservations_seathold".')


def refuse(depth: int) -> None:
    """Raise PostgreSQL's refusal ``depth`` calls down: a traceback of many lines."""
    if depth:
        refuse(depth - 1)
    raise IntegrityError(REFUSAL)


def failed_task(**fields) -> Failure:
    """A task that raised, recorded as django-q2's worker records one: the exception's
    text, " : ", its traceback (django_q/worker.py)."""
    try:
        refuse(8)
    except IntegrityError as error:
        result = f"{error} : {traceback.format_exc()}"
    now = timezone.now()
    return Failure.objects.create(**{
        "id": uuid.uuid4().hex, "name": "alpha-bravo-charlie-delta", "func": CHUNK_TASK,
        "args": (), "kwargs": {}, "result": result, "group": str(uuid.uuid4()),
        "started": now, "stopped": now, "success": False, **fields})


@pytest.fixture
def failed_delivery(dead_letter) -> Failure:
    """The failed task django-q2 recorded for a dead letter's delivery."""
    now = timezone.now()
    return Failure.objects.create(
        id=uuid.uuid4().hex, name="failed-delivery", func=CHUNK_TASK,
        args=(dead_letter.message,), kwargs={}, result="MessageError: ...",
        group=str(dead_letter.run_id), started=now, stopped=now, success=False)


def test_failed_tasks_offer_no_resubmit_and_point_to_the_dead_letters(admin_client,
                                                                      failed_delivery):
    page = admin_client.get(FAILED)

    content = page.content.decode()
    assert page.status_code == 200 and "failed-delivery" in content  # still listed
    assert page.context["action_form"] is None  # no action at all, resubmit included
    assert "resubmit_task" not in content
    assert f'href="{reverse("admin:cleanup_chunk_dead_letters")}"' in content


def test_posting_the_resubmit_action_sends_nothing_and_keeps_the_task(admin_client,
                                                                      failed_delivery,
                                                                      dead_letter):
    response = admin_client.post(FAILED, {"action": "resubmit_task", "index": "0",
                                          "_selected_action": [failed_delivery.pk]})

    assert response.status_code == 200
    assert OrmQ.objects.count() == 0
    assert Failure.objects.filter(pk=failed_delivery.pk).exists()
    assert Chunk.objects.get(pk=dead_letter.pk).state == Chunk.State.DEAD_LETTERED


def test_a_failed_task_cannot_be_changed_or_deleted(admin_client, failed_delivery):
    change = reverse("admin:django_q_failure_change", args=[failed_delivery.pk])
    delete = reverse("admin:django_q_failure_delete", args=[failed_delivery.pk])

    page = admin_client.get(change)

    assert page.status_code == 200 and 'name="_save"' not in page.content.decode()
    assert "dead letters by cause" in page.content.decode()
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert Failure.objects.filter(pk=failed_delivery.pk).exists()


def test_successful_tasks_offer_no_resubmit(admin_client, expired_leases):
    chunk = dispatch("expire-leases").run.chunks.get()
    apply_chunk(chunk.message)
    now = timezone.now()
    Success.objects.create(id=uuid.uuid4().hex, name="delivered", func=CHUNK_TASK,
                           args=(chunk.message,), kwargs={}, result="deleted",
                           group=str(chunk.run_id), started=now, stopped=now, success=True)
    OrmQ.objects.all().delete()

    page = admin_client.get(SUCCEEDED)
    admin_client.post(SUCCEEDED, {"action": "resubmit_task", "index": "0",
                                  "_selected_action": [Success.objects.get().pk]})

    assert page.status_code == 200 and page.context["action_form"] is None
    assert OrmQ.objects.count() == 0


def test_queued_chunk_messages_cannot_be_deleted_from_the_queue_page(admin_client,
                                                                    expired_leases):
    dispatch("expire-leases")
    queued = OrmQ.objects.get()

    page = admin_client.get(QUEUED)
    admin_client.post(QUEUED, {"action": "delete_selected", "post": "yes", "index": "0",
                               "_selected_action": [queued.pk]})
    delete = admin_client.post(reverse("admin:django_q_ormq_delete", args=[queued.pk]),
                               {"post": "yes"})

    assert page.status_code == 200 and page.context["action_form"] is None
    assert delete.status_code == 403
    assert OrmQ.objects.filter(pk=queued.pk).exists()


def test_staff_who_may_view_tasks_still_read_the_failed_ones(client, failed_delivery):
    user = User.objects.create_user("support", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(content_type__app_label="django_q",
                                                     codename="view_failure"))
    client.force_login(user)

    listing = client.get(FAILED)
    detail = client.get(reverse("admin:django_q_failure_change", args=[failed_delivery.pk]))

    assert listing.status_code == 200 and "failed-delivery" in listing.content.decode()
    assert detail.status_code == 200




def test_failed_tasks_list_the_whole_error_line_its_run_and_the_consoles_instants(
        admin_client):
    run_id = uuid.uuid4()
    stopped = datetime(2026, 12, 5, 22, 7, 50, tzinfo=UTC)
    failure = failed_task(group=str(run_id), started=stopped - timedelta(seconds=1.5),
                          stopped=stopped)

    page = admin_client.get(FAILED).content.decode()

    # django-q2 showed the result's first 100 characters, the exception's text first.
    assert (f'<td class="field-error"><span title="{escape(failure.result.strip())}">'
            f'IntegrityError: {escape(REFUSAL.splitlines()[0])}</span></td>') in page
    assert (f'<a class="short-id" href="{reverse("admin:cleanup_run_change", args=[run_id])}"'
            f' title="{run_id}">{str(run_id)[:8]}</a>') in page
    assert ('<span class="moment" title="2026-12-05T22:07:50.000000+00:00">'
            '2026-12-05 22:07:50</span><br><small>after 1.5 s</small>') in page
    assert "cleanup.<wbr>tasks.<wbr>apply_chunk" in page


@pytest.mark.parametrize(("result", "line"), [
    ("Task exceeded maximum timeout value (120 seconds) : Traceback (most recent call "
     "last):\n  File \"/srv/app/django_q/worker.py\", line 98, in worker\n    res = f()\n"
     "django_q.exceptions.TimeoutException: Task exceeded maximum timeout value (120 "
     "seconds)", "TimeoutException: Task exceeded maximum timeout value (120 seconds)"),
    ("written by hand\nwithout a traceback", "written by hand"),
    (None, ""),
])
def test_a_failed_tasks_error_line_is_its_exceptions_own(result, line):
    assert error_line(result) == line
