"""How the console's actions run: only the ones offered, the destructive ones confirmed
on a second page (the pattern of Django's ``delete_selected``), then back to where the
operator acted from, with what they did and what they left alone."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django import forms
from django.contrib import messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.db.models import Count, IntegerField, Max, TextField
from django.db.models.functions import Cast
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import ngettext

from cleanup.console.parameters import CheckedRequestsAdmin
from cleanup.engine.replay import replay
from cleanup.exceptions import ActionResult, CleanupError


def actor(request) -> str:
    return f"admin:{request.user.get_username()}"


@dataclass(frozen=True)
class Action:
    """What one confirmed action is called, asks and says (``ConfirmedActionsAdmin.act``)."""

    name: str  # the action's own name: the confirmation page posts it back
    title: str
    question: str
    done: tuple[str, str]  # singular and plural, with %(count)d
    skipped: str = ""  # what was left alone, with %(count)d; "" says nothing of it
    skipped_plural: str = ""  # where it differs from the singular
    logged: str = ""  # the admin log's entry for each row changed, with the form's fields
    form: type[forms.Form] | None = None  # asked on the confirmation page (a reason)


class ConfirmedActionsAdmin(CheckedRequestsAdmin):
    """Actions over a ledger list, each checked, confirmed and reported the same way."""

    def changelist_view(self, request, extra_context=None):
        """Refuse, with 403, an action this user was not offered (a forged POST)."""
        action = request.POST.get("action") if request.method == "POST" else None
        if action and action not in self.get_actions(request):
            raise PermissionDenied
        return super().changelist_view(request, extra_context)

    def act(self, request, queryset, action: Action,
            operate: Callable[[object, dict], ActionResult]):
        """Confirm, call the operation on the selection with what the form asked, log each
        row it changed, report what it did and left alone, and go back to where the
        operator acted from. An operation's refusal is reported instead, nothing changed."""
        form = action.form(request.POST if "reason" in request.POST else None) \
            if action.form else None
        if not self.confirmed(request, queryset) or (form is not None and not form.is_valid()):
            return self.confirmation(request, queryset, action.name, action.title,
                                     action.question, form=form)
        given = form.cleaned_data if form is not None else {}
        try:
            result = operate(queryset, given)
        except CleanupError as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return self.back_to_where_they_were(request)
        for row in self.changed_rows(result.affected):
            self.log_change(request, row, action.logged % given)
        self.report(request, result, action)
        return self.back_to_where_they_were(request)

    def changed_rows(self, pks):
        """The rows an action changed, read for their admin log entries."""
        return self.model._default_manager.filter(pk__in=pks)

    def replay_each(self, request, selection: dict, logged: Callable[[object], str]
                    ) -> ActionResult:
        """Replay each run's selected chunks: a run refused is told why and left out, the
        others still go; each run replayed is logged (it changes no row of this list)."""
        resent = skipped = 0
        for run_id, chunk_ids in selection.items():
            try:
                result = replay(run_id, chunk_ids=chunk_ids)
            except CleanupError as exc:  # refused, and said why: nothing sent for it
                self.message_user(request, str(exc), messages.ERROR)
                continue
            resent, skipped = resent + result.resent, skipped + result.skipped
            self.log_change(request, result.run, logged(chunk_ids))
        return ActionResult(resent, skipped)

    def report(self, request, result: ActionResult, action: Action) -> None:
        """Tell the operator what an action did and what it left alone."""
        self.message_user(
            request, ngettext(*action.done, result.done) % {"count": result.done},
            messages.SUCCESS if result.done else messages.WARNING,
        )
        if result.skipped and action.skipped:
            self.message_user(request, ngettext(
                action.skipped, action.skipped_plural or action.skipped, result.skipped)
                % {"count": result.skipped}, messages.WARNING)

    def confirmation(self, request, queryset, action: str, title: str, question: str,
                     form=None):
        """The two-step confirmation page of a destructive action."""
        context = {
            **self.admin_site.each_context(request),
            "title": title,
            "question": question,
            "objects": queryset[:100],
            "count": queryset.count(),
            "action": action,
            "form": form,
            "opts": self.model._meta,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "next": self._next_url(request) or "",
            "back": self._next_url(request) or request.get_full_path(),
        }
        if self._across(request):
            # Every row of the filtered list: carried as the filter itself (thousands of
            # ids would pass Django's limit on form fields), with what it held when shown.
            context.update(select_across=True, expected=self._fingerprint(queryset),
                           selected=[str(queryset.order_by("pk").values_list(
                               "pk", flat=True).first())])
        else:
            context["selected"] = [str(pk) for pk in
                                   queryset.order_by().values_list("pk", flat=True)]
        return TemplateResponse(request, "admin/cleanup/confirm_action.html", context)

    def confirmed(self, request, queryset) -> bool:
        """The operator said yes on the confirmation page, to exactly what it showed."""
        if request.POST.get("post") != "yes":
            return False
        if self._across(request) and request.POST.get("expected") != self._fingerprint(
                queryset):
            self.message_user(request, "The rows the list holds changed since the "
                              "confirmation was shown: check them and confirm again.",
                              messages.WARNING)
            return False
        return True

    @staticmethod
    def _across(request) -> bool:
        return request.POST.get("select_across") == "1"

    @staticmethod
    def _fingerprint(queryset) -> str:
        """How many rows, and the highest pk: enough to tell a list that gained or lost
        rows since it was shown."""
        # PostgreSQL has no max(uuid): a run's id is compared as its text, in the same order.
        last = (Max("pk") if isinstance(queryset.model._meta.pk, IntegerField)
                else Max(Cast("pk", TextField())))
        figures = queryset.order_by().aggregate(rows=Count("pk"), last=last)
        return f"{figures['rows']}:{figures['last']}"

    def _next_url(self, request) -> str | None:
        """The page the operator acted from (a chunk page, the dead-letter groups), if the
        action was sent from one; None sends them back to the list they acted on."""
        target = request.POST.get("next", "")
        if target and url_has_allowed_host_and_scheme(
                target, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
            return target
        return None

    def back_to_where_they_were(self, request):
        """After an action: the page it was sent from, or (None) the list it ran on."""
        target = self._next_url(request)
        return HttpResponseRedirect(target) if target else None
