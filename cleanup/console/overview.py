"""The overview page: per policy, backlog, stalled work, missed schedules, dead letters,
and whether any cluster takes work; the halts a policy removed by a deploy left open."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone

from cleanup.console.base import LedgerAdmin
from cleanup.console.forms import PauseForm
from cleanup.engine import halts, operations, steps
from cleanup.engine.transport import redelivery_window
from cleanup.exceptions import CleanupError
from cleanup.observability import blockers
from cleanup.observability import health as health_report
from cleanup.observability.live import live_view
from cleanup.observability.overview import (
    BACKLOG_BUDGET_MS,
    banner,
    gone_policies,
    overview,
)
from cleanup.policies import all_policies

OVERVIEW_REFRESH_SECONDS = 5


class CleanupOverviewAdmin(LedgerAdmin):
    """Per policy: backlog, stalled work, missed schedules, dead letters."""

    def has_view_permission(self, request, obj=None):
        return request.user.has_perm("cleanup.view_run")

    def get_urls(self):
        return [
            path("", self.admin_site.admin_view(self.changelist_view),
                 name="cleanup_cleanupoverview_changelist"),
            path("pause/<str:policy>/", self.admin_site.admin_view(self.pause_view),
                 name="cleanup_policy_pause"),
            path("resume/<str:policy>/", self.admin_site.admin_view(self.resume_view),
                 name="cleanup_policy_resume"),
            path("blockers/<str:policy>/", self.admin_site.admin_view(self.blockers_view),
                 name="cleanup_policy_blockers"),
        ]

    def changelist_view(self, request, extra_context=None):
        if not self.has_view_permission(request):
            raise PermissionDenied
        now = timezone.now()
        policies = overview(now)
        gone = gone_policies(now)
        clusters = health_report.report()[1].get("clusters", [])
        context = {
            **self.admin_site.each_context(request),
            "title": "Cleanup overview",
            "opts": self.opts,
            "policies": policies,
            "gone_policies": gone,
            "clusters": clusters,
            "alerts": banner(policies, clusters, gone, steps.blocked_now()),
            "now": now,
            "redelivery_window": redelivery_window(),
            "refresh_seconds": OVERVIEW_REFRESH_SECONDS,
            "can_pause": self.has_pause_permission(request),
            "live": live_view(now),
            "backlog_budget_ms": BACKLOG_BUDGET_MS,
        }
        return TemplateResponse(request, "admin/cleanup/cleanupoverview/overview.html",
                                context)

    def blockers_view(self, request, policy):
        """Who keeps a policy's chunks waiting: the blocking sessions, read from
        PostgreSQL now, and the chunks waiting on them."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            "title": f"What {policy} waits on",
            "opts": self.opts, "policy": policy,
            "blockers": blockers.for_policy(policy),
            # A pause or a halt keeps it from planning whatever no lock does: said too.
            "halts": [halts.describe(halt) for halt in halts.open_halts(policy)],
        }
        return TemplateResponse(request, "admin/cleanup/cleanupoverview/blockers.html",
                                context)

    def pause_view(self, request, policy):
        """Pause a policy: a form for the reason, then the pause (nothing new is planned
        until it is resumed)."""
        return self._halt_page(request, policy, pause=True)

    def resume_view(self, request, policy):
        """Resume a paused policy after a confirmation; its window refills at once. A
        policy no longer registered has every halt it left open ended (a name with none
        is refused by the service)."""
        return self._halt_page(request, policy, pause=False)

    def _halt_page(self, request, policy, *, pause: bool):
        if not self.has_pause_permission(request):
            raise PermissionDenied
        form = PauseForm(request.POST or None) if pause else None
        halted = halts.open_halts(policy)
        # Removed by a deploy with halts left open; a name with none is refused below.
        gone = bool(halted) and policy not in {known.name for known in all_policies()}
        back = HttpResponseRedirect(reverse("admin:cleanup_cleanupoverview_changelist"))
        if request.method == "POST" and (form is None or form.is_valid()):
            actor = request.user.get_username()
            try:
                if pause:
                    change = operations.pause_policy(policy, form.cleaned_data["reason"],
                                                     actor=actor)
                else:
                    change = operations.resume_policy(policy, actor=actor)
            except CleanupError as exc:
                self.message_user(request, str(exc), messages.ERROR)
                return back
            described = halts.describe(change.halt)
            if not change.changed:
                text = f"{policy} was already {described}; nothing changed."
            elif pause:
                text = f"Paused {policy}: nothing new is planned until it is resumed."
            elif gone:
                text = (f"Ended the halts of {policy}, which is no longer registered; it "
                        f"was {described}.")
            else:
                text = (f"Resumed {policy} after it was {described}; "
                        f"{change.planned} chunks planned now.")
            self.message_user(request, text, messages.SUCCESS if change.changed
                              else messages.WARNING)
            return back
        context = {
            **self.admin_site.each_context(request),
            "title": f"{'Pause' if pause else 'Resume'} {policy}",
            "opts": self.opts, "policy": policy, "form": form, "pause": pause, "gone": gone,
            "halted": [halts.describe(halt) for halt in halted],
        }
        return TemplateResponse(request, "admin/cleanup/cleanupoverview/halt_form.html",
                                context)
