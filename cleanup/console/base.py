"""What every page of the console shares: the ledger is read-only, styled by the
console's stylesheet, and acted on only through actions the user's permissions offer."""

from __future__ import annotations

from cleanup import display
from cleanup.console.actions import ConfirmedActionsAdmin
from cleanup.models import Run


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


class LedgerAdmin(ConfirmedActionsAdmin):
    """Ledger rows are written by the engine only: no add, change or delete by hand."""

    class Media:
        # The console's badges, instants and column widths, on each of its pages.
        css = {"all": ("cleanup/console.css",)}

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
