"""Admin pages for tenants, sections and seat holds."""

from __future__ import annotations

from django.contrib import admin
from django.utils import timezone
from django.utils.html import format_html

from reservations.models import ReminderAttempt, SeatHold, Section, Tenant

BADGES = {
    "held": ("#2a6ebb", "held"),
    "confirmed": ("#1d6b1d", "confirmed"),
    "expired": ("#c77c00", "expired, awaiting cleanup"),
}


class ExpiryFilter(admin.SimpleListFilter):
    title = "expiry"
    parameter_name = "expired"

    def lookups(self, request, model_admin):
        return [("yes", "Expired, awaiting cleanup"), ("no", "Not expired")]

    def queryset(self, request, queryset):
        now = timezone.now()
        if self.value() == "yes":
            return queryset.filter(status=SeatHold.Status.HELD, expires_at__lte=now)
        if self.value() == "no":
            return queryset.exclude(status=SeatHold.Status.HELD, expires_at__lte=now)
        return queryset


@admin.register(SeatHold)
class SeatHoldAdmin(admin.ModelAdmin):
    list_display = ("id", "learner_ref", "tenant", "section", "state_badge", "expires_at",
                    "updated_at")
    list_filter = ("tenant", "section", "status", ExpiryFilter)
    list_select_related = ("tenant", "section")
    search_fields = ("learner_ref",)
    date_hierarchy = "expires_at"
    raw_id_fields = ("section",)

    @admin.display(description="state", ordering="status")
    def state_badge(self, hold):
        key = hold.status
        if key == SeatHold.Status.HELD and hold.expires_at <= timezone.now():
            key = "expired"
        colour, label = BADGES[key]
        return format_html(
            '<span style="background:{};color:#fff;padding:1px 6px;border-radius:8px">{}</span>',
            colour, label,
        )


@admin.register(Section)
class SectionAdmin(admin.ModelAdmin):
    list_display = ("title", "tenant", "capacity")
    list_filter = ("tenant",)
    search_fields = ("title",)


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    search_fields = ("name",)


@admin.register(ReminderAttempt)
class ReminderAttemptAdmin(admin.ModelAdmin):
    list_display = ("id", "tenant", "hold_id", "learner_ref", "channel", "sent_at")
    list_filter = ("tenant", "channel")
    date_hierarchy = "sent_at"
