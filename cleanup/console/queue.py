"""django-q2's own task pages, read-only beside the console.

django-q2 registers its failed, successful and queued tasks with an action that
resubmits them: for a chunk, a second delivery path around the console's
confirmations and its ledger. Here they stay readable, lose that action and any
change or delete, and each page points to where a chunk is acted on: the dead letters
by cause. The failed and successful tasks' lists read as the console's do: instants in
UTC to the second, a chunk's group as its run's short id, and a failure's error line
whole (django-q2 cuts its result at 100 characters), its traceback on hover.
"""

from __future__ import annotations

import uuid

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from django_q import admin as django_q_admin
from django_q.models import Failure, OrmQ, Success

from cleanup import display
from cleanup.console.parameters import CheckedRequestsAdmin
from cleanup.engine.transport import CHUNK_TASK
from cleanup.exceptions import cause_of

# How django-q2's worker records a task that raised: "<its text> : <its traceback>".
TRACEBACK_AFTER = " : Traceback ("


class ReadOnlyTaskAdmin(CheckedRequestsAdmin):
    """A django-q2 task page that shows, and never resubmits, changes or deletes."""

    class Media:
        css = {"all": ("cleanup/console.css",)}

    change_list_template = "admin/cleanup/django_q/change_list.html"
    change_form_template = "admin/cleanup/django_q/change_form.html"
    actions = None

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class TaskListAdmin(ReadOnlyTaskAdmin):
    """A list of the tasks a worker ran, a chunk's group read as its run."""

    @admin.display(description="group", ordering="group")
    def group_link(self, task):
        """A chunk's group is its run's id: the run's short id, linked to the run."""
        try:
            run_id = uuid.UUID(task.group or "")
        except ValueError:
            return task.group or "-"
        if task.func != CHUNK_TASK:
            return display.id_html(run_id)
        return display.id_html(run_id, reverse("admin:cleanup_run_change", args=[run_id]))


class FailureAdmin(TaskListAdmin, django_q_admin.FailAdmin):
    # One instant, not two: the error's line takes the room a second one would.
    list_display = ("name", "group_link", "function", "cluster", "failed_at", "error")

    @admin.display(description="function", ordering="func")
    def function(self, task):
        """Its dotted path, broken after a dot rather than widening the table."""
        return format_html_join(mark_safe(".<wbr>"), "{}",
                                ((part,) for part in task.func.split(".")))

    @admin.display(description="failed at", ordering="stopped")
    def failed_at(self, task):
        """When it stopped, and how long it ran before."""
        return format_html("{}<br><small>after {}</small>", display.moment_html(task.stopped),
                           display.duration((task.stopped - task.started).total_seconds()))

    @admin.display(description="error")
    def error(self, task):
        """The exception's own line; its traceback on hover, and on the task's page."""
        return format_html('<span title="{}">{}</span>', str(task.result or "").strip(),
                           error_line(task.result))


class SuccessAdmin(TaskListAdmin, django_q_admin.TaskAdmin):
    list_display = ("name", "group_link", "func", "cluster", "started_at", "stopped_at",
                    "time_taken")

    @admin.display(description="started at", ordering="started")
    def started_at(self, task):
        return display.moment_html(task.started)

    @admin.display(description="stopped at", ordering="stopped")
    def stopped_at(self, task):
        return display.moment_html(task.stopped)


class QueuedAdmin(ReadOnlyTaskAdmin, django_q_admin.QueueAdmin):
    pass


def error_line(result: object) -> str:
    """The line of a failed task's result an operator reads first: the exception itself
    (``IntegrityError: update or delete on table ...``), as a chunk's cause reads (up to
    its 255 characters)."""
    text = str(result or "")
    _, found, traceback = text.partition(TRACEBACK_AFTER)
    return cause_of("Traceback (" + traceback if found else text)


READ_ONLY = {Failure: FailureAdmin, Success: SuccessAdmin, OrmQ: QueuedAdmin}


def replace_task_admins(site: admin.AdminSite) -> None:
    """Register the read-only pages in place of django-q2's, where it registered them
    (importing django_q.admin above did, whichever app the admin discovered first)."""
    for model, model_admin in READ_ONLY.items():
        if site.is_registered(model):
            site.unregister(model)
            site.register(model, model_admin)
