"""The slot ledger's page: each schedule slot the scheduler fired and what it did."""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from cleanup import display
from cleanup.console.badges import SLOT_OUTCOMES
from cleanup.console.base import LedgerAdmin


class SlotAdmin(LedgerAdmin):
    """The slot ledger: each schedule slot the scheduler fired and what it did."""

    list_display = ("policy_name", "slot", "fired", "outcome_badge", "run_link", "dispatched")
    list_filter = ("policy", "outcome")
    fields = ("policy", "slot_at", "fired_at", "dispatched_at", "outcome", "run_link")
    readonly_fields = fields

    @admin.display(description="policy", ordering="policy")
    def policy_name(self, slot):
        return format_html('<span class="policy-name">{}</span>', slot.policy)

    @admin.display(description="slot", ordering="slot_at")
    def slot(self, slot):
        return display.moment_html(slot.slot_at)

    @admin.display(description="fired at", ordering="fired_at")
    def fired(self, slot):
        """When the scheduler fired it: the date only where it is not the slot's."""
        return display.moment_html(slot.fired_at, relative=True,
                                   date=slot.fired_at.date() != slot.slot_at.date())

    @admin.display(description="outcome", ordering="outcome")
    def outcome_badge(self, slot):
        return display.badge(slot.outcome, SLOT_OUTCOMES.get(slot.outcome, slot.outcome),
                             slot.get_outcome_display(), known=SLOT_OUTCOMES, what="outcome")

    @admin.display(description="run")
    def run_link(self, slot):
        if not slot.run_id:
            return "-"
        return display.id_html(slot.run_id, reverse("admin:cleanup_run_change",
                                                    args=[slot.run_id]))

    @admin.display(description="dispatched", ordering="dispatched_at")
    def dispatched(self, slot):
        """When a worker dispatched it, and how long after the scheduler fired it."""
        if slot.dispatched_at is None:
            return "-"
        same_day = slot.dispatched_at.date() == slot.fired_at.date()
        return format_html("{}<br><small>{} after firing</small>",
                           display.moment_html(slot.dispatched_at, date=not same_day),
                           display.duration((slot.dispatched_at - slot.fired_at)
                                            .total_seconds()))
