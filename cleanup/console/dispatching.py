"""The run pages that start work: dispatch a policy now, and replay a run with a new
cutoff. Each is a form, the dispatch's own dry run, then a confirmation."""

from __future__ import annotations

import uuid

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone

from cleanup import display
from cleanup.console.base import LedgerAdmin
from cleanup.console.forms import DispatchForm, NewCutoffForm
from cleanup.engine.dispatch import describe_dispatch, dispatch, preview_dispatch
from cleanup.engine.replay import replay
from cleanup.exceptions import CleanupError
from cleanup.models import Run
from cleanup.policies import get_policy


class DispatchPagesAdmin(LedgerAdmin):
    """The runs' admin's pages that dispatch, beside its list and run pages."""

    def get_urls(self):
        return [
            path("dispatch/", self.admin_site.admin_view(self.dispatch_view),
                 name="cleanup_run_dispatch"),
            path("<uuid:run_id>/replay/", self.admin_site.admin_view(self.new_cutoff_view),
                 name="cleanup_run_replay"),
        ] + super().get_urls()

    def dispatch_view(self, request):
        """Dispatch a policy now: form, dry-run preview, then confirmation."""
        if not self.has_dispatch_permission(request):
            raise PermissionDenied
        form = DispatchForm(request.POST or None)
        context = {"title": "Dispatch a policy now", "form": form}
        if request.method == "POST" and form.is_valid():
            policy = form.cleaned_data["policy"]
            scheme = form.cleaned_data["scheme"] or None
            try:
                if "_confirm" in request.POST:
                    key = self._confirm_key(request)
                    result = dispatch(policy, scheme=scheme, cutoff=form.cleaned_data["cutoff"],
                                      key=f"admin:{key}", trigger=Run.Trigger.ADMIN)
                    return self._started(request, result.run, result.created,
                                         f"Dispatched {policy} from the admin",
                                         describe_dispatch(result))
                context.update(self._preview(policy, scheme, form.cleaned_data["cutoff"]))
            except CleanupError as exc:
                form.add_error(None, str(exc))
        return self._form_page(request, context)

    def new_cutoff_view(self, request, run_id):
        """Replay a run with a new cutoff: form, dry-run preview, then confirmation."""
        if not self.has_replay_permission(request):
            raise PermissionDenied
        run = Run.objects.filter(pk=run_id).first()
        if run is None:
            self.message_user(request, f"No run with id {run_id}.", messages.ERROR)
            return HttpResponseRedirect(reverse("admin:cleanup_run_changelist"))
        form = NewCutoffForm(request.POST or None)
        context = {"title": f"Replay run {display.short_id(run.id)} with a new cutoff",
                   "form": form, "run": run}
        if request.method == "POST" and form.is_valid():
            cutoff = form.cleaned_data["cutoff"] or timezone.now()  # empty: now
            try:
                if "_confirm" in request.POST:
                    result = replay(run.pk, new_cutoff=cutoff)
                    return self._started(request, result.run, result.created,
                                         f"Replay of run {run.id} with a new cutoff")
                context.update(self._preview(run.policy, run.scheme, cutoff, not_before=run))
            except CleanupError as exc:
                form.add_error(None, str(exc))
        return self._form_page(request, context)

    def _preview(self, policy_name, scheme, cutoff, not_before=None) -> dict:
        """What the dispatch would do: its own dry run, per partition."""
        result = preview_dispatch(policy_name, scheme=scheme, cutoff=cutoff,
                                  replay_of=not_before)
        field = get_policy(policy_name).partition_field
        return {"preview": result.preview, "preview_cutoff": result.cutoff.isoformat(),
                "preview_scheme": result.scheme, "confirm_key": uuid.uuid4(),
                # Named for what the policy partitions by (a tenant, a run, a policy).
                "preview_partition": field.replace("_", " ").capitalize() if field
                else "Partition"}

    def _confirm_key(self, request) -> uuid.UUID:
        try:
            return uuid.UUID(request.POST.get("confirm_key", ""))
        except ValueError:
            raise CleanupError("the confirmation was tampered with; start again") from None

    def _started(self, request, run, created, log_message, summary: str = ""):
        """Say what the dispatch did (the command's own sentence, where there is one)."""
        if created:
            self.log_change(request, run, log_message)
            if not summary:
                planned = (f"{display.number(run.chunks_planned)} chunks for "
                           f"{display.number(run.candidates)} rows" if run.planned_all
                           else f"first {display.number(run.chunks_planned)} chunks sent, "
                           "the rest planned as they finish")
                summary = f"Started run {run.id}: {planned}."
            self.message_user(request, summary, messages.SUCCESS)
        else:
            self.message_user(request, f"Run {run.id} had already been started; "
                              "nothing new was sent.", messages.WARNING)
        return HttpResponseRedirect(reverse("admin:cleanup_run_change", args=[run.pk]))

    def _form_page(self, request, context):
        context = {**self.admin_site.each_context(request), "opts": self.opts, **context}
        return TemplateResponse(request, "admin/cleanup/run/preview_form.html", context)
