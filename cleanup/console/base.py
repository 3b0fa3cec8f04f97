"""What every page of the console shares: the ledger is read-only, styled by the
console's stylesheet, and acted on only through actions the user's permissions offer;
and what a host's own admin pages take from it (ConsoleAdmin)."""

from __future__ import annotations

from django.contrib import admin, messages
from django.template.response import SimpleTemplateResponse
from django.utils.text import capfirst

from cleanup import display
from cleanup.console.actions import ConfirmedActionsAdmin
from cleanup.console.parameters import CheckedRequestsAdmin
from cleanup.models import Run
from cleanup.observability.backlog import Budget
from cleanup.observability.overview import BACKLOG_BUDGET_MS

# How long a host's list may read, statement by statement: the overview's budget for
# a backlog, so a list answers as soon as the overview does whatever holds its table.
LIST_BUDGET_MS = BACKLOG_BUDGET_MS


def shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def runs_by_short_id(text: str) -> list:
    """The ids of the runs a full id or an 8-hex-digit short id names."""
    parsed = display.parse_id(text)
    if parsed is None:
        return []
    if not isinstance(parsed, str):
        return list(Run.objects.filter(pk=parsed).values_list("pk", flat=True))
    return list(Run.objects.filter(pk__range=display.id_range(parsed)).order_by()
                .values_list("pk", flat=True)[:20])


def count_field(model, name: str):
    """A count of the ledger on a read-only page, with thousands separators (the admin
    prints an integer field bare: 20000), labelled and explained as the field is."""
    field = model._meta.get_field(name)

    @admin.display(description=field.verbose_name)
    def shown(model_admin, obj):
        value = getattr(obj, name)
        return "-" if value is None else display.number(value)

    shown.help_text = field.help_text
    return shown


class LedgerAdmin(ConfirmedActionsAdmin):
    """Ledger rows are written by the engine only: no add, change or delete by hand."""

    class Media:
        # The console's badges, instants and column widths, on each of its pages.
        css = {"all": ("cleanup/console.css",)}

    def get_form(self, request, obj=None, **kwargs):
        """The form of a read-only page, with each count_field's help text (the admin
        takes it from the form where a row is not the model's field)."""
        help_texts = {name: getattr(self, name).help_text
                      for name in self.get_readonly_fields(request, obj)
                      if getattr(getattr(self, name, None), "help_text", "")}
        return super().get_form(request, obj, help_texts=help_texts, **kwargs)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_replay_permission(self, request):
        return request.user.has_perm("cleanup.replay")

    def has_requeue_permission(self, request):
        return request.user.has_perm("cleanup.requeue")

    def has_discard_permission(self, request):
        return request.user.has_perm("cleanup.discard")

    def has_dispatch_permission(self, request):
        return request.user.has_perm("cleanup.dispatch")

    def has_cancel_permission(self, request):
        return request.user.has_perm("cleanup.cancel")

    def has_pause_permission(self, request):
        return request.user.has_perm("cleanup.pause")


class ConsoleAdmin(CheckedRequestsAdmin):
    """A host's admin page in the console's manner: its stylesheet, its requests checked
    as the console's are, and its list read within ``list_budget_ms``. Past it (its
    table locked ACCESS EXCLUSIVE by a migration, say) the list says so and lists
    nothing, as the overview says a backlog it could not count is unknown, rather than
    wait for the lock."""

    list_budget_ms = LIST_BUDGET_MS

    class Media:
        css = {"all": ("cleanup/console.css",)}

    def changelist_view(self, request, extra_context=None):
        view = super().changelist_view
        if request.method not in ("GET", "HEAD"):
            return view(request, extra_context)  # an action's writes are not cut short
        # Rendered inside the budget: the rows, the date drill-down and the facets are
        # read as the template asks for them.
        page = Budget(self.list_budget_ms).read(lambda: _rendered(view(request,
                                                                      extra_context)))
        if page is not None:
            return page
        request.console_list_unread = True
        self.message_user(request, f"{capfirst(self.opts.verbose_name_plural)} not read "
                          f"within {self.list_budget_ms:,} ms (is the table locked?): "
                          "none are listed.", messages.WARNING)
        return view(request, extra_context)

    def get_queryset(self, request):
        rows = super().get_queryset(request)
        # Once the list's budget ran out, the page is drawn without reading the table.
        return rows.none() if getattr(request, "console_list_unread", False) else rows


def _rendered(response):
    return response.render() if isinstance(response, SimpleTemplateResponse) else response
