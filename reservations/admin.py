"""Admin pages for tenants, sections, seat holds, their reminders and reminder attempts."""

from __future__ import annotations

from django.contrib import admin
from django.utils import timezone
from django.utils.html import format_html

from reservations.models import Reminder, ReminderAttempt, SeatHold, Section, Tenant

BADGES = {
    "held": ("#2a6ebb", "held"),
    "confirmed": ("#1d6b1d", "confirmed"),
    "expired": ("#c77c00", "expired, awaiting cleanup"),
}
REMINDER_BADGES = {
    "pending": ("#6b6b6b", "pending"),
    "overdue": ("#c77c00", "pending, overdue"),
    "ready": ("#2a6ebb", "ready to send"),
    "sent": ("#1d6b1d", "sent"),
    "cancelled": ("#8a8a8a", "cancelled"),
}


def badge(colour: str, label: str):
    return format_html(
        '<span style="background:{};color:#fff;padding:1px 6px;border-radius:8px">{}</span>',
        colour, label,
    )


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
        return badge(*BADGES[key])


@admin.register(Section)
class SectionAdmin(admin.ModelAdmin):
    list_display = ("title", "tenant", "capacity")
    list_filter = ("tenant",)
    search_fields = ("title",)


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    search_fields = ("name",)


class DueFilter(admin.SimpleListFilter):
    title = "due"
    parameter_name = "due"

    def lookups(self, request, model_admin):
        return [("unsent", "Due and not sent"), ("later", "Not due yet")]

    def queryset(self, request, queryset):
        now = timezone.now()
        if self.value() == "unsent":
            return queryset.filter(state__in=("pending", "ready"), due_at__lte=now)
        if self.value() == "later":
            return queryset.filter(due_at__gt=now)
        return queryset


@admin.register(Reminder)
class ReminderAdmin(admin.ModelAdmin):
    """Read-only: reminders follow their holds (the services) and cleanup's marking."""

    list_display = ("id", "learner_ref", "tenant", "hold_id", "state_badge", "due_at",
                    "sent_at")
    list_filter = ("state", DueFilter, "tenant")
    list_select_related = ("tenant",)
    search_fields = ("learner_ref", "=hold__id")
    date_hierarchy = "due_at"
    readonly_fields = ("tenant", "hold_id", "learner_ref", "state", "due_at", "ready_at",
                       "sent_at", "created_at", "updated_at")
    fields = readonly_fields

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="state", ordering="state")
    def state_badge(self, reminder):
        key = reminder.state
        if key == "pending" and reminder.due_at <= timezone.now():
            key = "overdue"
        return badge(*REMINDER_BADGES[key])


@admin.register(ReminderAttempt)
class ReminderAttemptAdmin(admin.ModelAdmin):
    list_display = ("id", "tenant", "hold_id", "learner_ref", "channel", "sent_at",
                    "message_id")
    list_filter = ("tenant", "channel")
    date_hierarchy = "sent_at"
