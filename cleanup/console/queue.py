"""django-q2's own task pages, read-only beside the console.

django-q2 registers its failed, successful and queued tasks with an action that
resubmits them: for a chunk, a second delivery path around the console's
confirmations and its ledger. Here they stay readable, lose that action and any
change or delete, and each page points to where a chunk is acted on: the dead letters
by cause.
"""

from __future__ import annotations

from django.contrib import admin
from django_q import admin as django_q_admin
from django_q.models import Failure, OrmQ, Success

from cleanup.console.parameters import CheckedRequestsAdmin


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


class FailureAdmin(ReadOnlyTaskAdmin, django_q_admin.FailAdmin):
    pass


class SuccessAdmin(ReadOnlyTaskAdmin, django_q_admin.TaskAdmin):
    pass


class QueuedAdmin(ReadOnlyTaskAdmin, django_q_admin.QueueAdmin):
    pass


READ_ONLY = {Failure: FailureAdmin, Success: SuccessAdmin, OrmQ: QueuedAdmin}


def replace_task_admins(site: admin.AdminSite) -> None:
    """Register the read-only pages in place of django-q2's, where it registered them
    (importing django_q.admin above did, whichever app the admin discovered first)."""
    for model, model_admin in READ_ONLY.items():
        if site.is_registered(model):
            site.unregister(model)
            site.register(model, model_admin)
