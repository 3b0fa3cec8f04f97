"""The overview page: per policy, backlog, stalled work, missed schedules, dead letters,
and whether any cluster takes work."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse
from django.urls import path
from django.utils import timezone

from cleanup.conf import lease
from cleanup.console.base import LedgerAdmin
from cleanup.observability import health as health_report
from cleanup.observability.overview import banner, overview

OVERVIEW_REFRESH_SECONDS = 5


class CleanupOverviewAdmin(LedgerAdmin):
    """Per policy: backlog, stalled work, missed schedules, dead letters."""

    def has_view_permission(self, request, obj=None):
        return request.user.has_perm("cleanup.view_run")

    def get_urls(self):
        return [path("", self.admin_site.admin_view(self.changelist_view),
                     name="cleanup_cleanupoverview_changelist")]

    def changelist_view(self, request, extra_context=None):
        if not self.has_view_permission(request):
            raise PermissionDenied
        now = timezone.now()
        policies = overview(now)
        clusters = health_report.report()[1].get("clusters", [])
        context = {
            **self.admin_site.each_context(request),
            "title": "Cleanup overview",
            "opts": self.opts,
            "policies": policies,
            "clusters": clusters,
            "alerts": banner(policies, clusters),
            "now": now,
            "lease": lease(),
            "refresh_seconds": OVERVIEW_REFRESH_SECONDS,
        }
        return TemplateResponse(request, "admin/cleanup/cleanupoverview/overview.html",
                                context)
