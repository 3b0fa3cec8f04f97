"""Admin pages for tenants, sections, seat holds, their reminders and reminder attempts,
and the waitlists: entries, what each freed seat produced, the offers' mails.

Cells use the console's one format (cleanup.display) and its stylesheet, so these lists
read like the cleanup ledger's and fit the same 1366 px laptop; each page is the
console's ConsoleAdmin, so it refuses what no query could take with 400, and its list
answers within a second while another session holds its table locked.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.utils import timezone
from django.utils.html import format_html

from cleanup.host import ConsoleAdmin, display
from reservations.exceptions import ReservationError
from reservations.models import (
    FreedSeat,
    OfferMail,
    Reminder,
    ReminderAttempt,
    SeatHold,
    Section,
    Tenant,
    WaitlistEntry,
)
from reservations.waitlist import join_waitlist

# Badge state (its class in console.css) and label, by what the row is now.
HOLD_BADGES = {
    "held": ("held", "held"),
    "confirmed": ("confirmed", "confirmed"),
}
REMINDER_BADGES = {
    "pending": ("pending", "pending"),
    "overdue": ("overdue", "pending, overdue"),
    "ready": ("ready", "ready to send"),
    "sending": ("sending", "sending"),
    "sent": ("sent", "sent"),
    "cancelled": ("cancelled", "cancelled"),
    "failed": ("failed", "failed"),
}
WAITLIST_BADGES = {
    "waiting": ("pending", "waiting"),
    "offered": ("ready", "offered"),
    "lapsed": ("expired", "offer lapsed"),
    "confirmed": ("confirmed", "confirmed"),
    "left": ("cancelled", "left"),
}
FREED_SEAT_BADGES = {
    "offered": ("sent", "offered"),
    "nobody_waiting": ("cancelled", "nobody waiting"),
    "no_room": ("failed", "no room"),
}
# A Message-ID is one long word; the list shows its start, the whole on hover.
MESSAGE_ID_PREVIEW = 28


def state_badge(badges: dict[str, tuple[str, str]], key: str, what: str):
    """The badge of a known state; a value written by hand past the choices as unknown."""
    if key not in badges:
        return display.badge("unknown", f"unknown: {key}", f"a {what} the code does not know")
    return display.badge(*badges[key])


def learner(ref: str, tenant: Tenant | None = None):
    """A learner's ref (one long word, wrapped anywhere), and the tenant's name below it."""
    if tenant is None:
        return format_html('<span class="learner-ref">{}</span>', ref)
    return format_html('<span class="learner-ref">{}</span><br><small>{}</small>', ref, tenant)




def shortened(text: str, limit: int):
    if len(text) <= limit:
        return text
    return format_html('<span title="{}">{}…</span>', text, text[: limit - 1])


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
class SeatHoldAdmin(ConsoleAdmin):
    list_display = ("id", "learner_ref_cell", "section_cell", "state_badge", "expires",
                    "updated")
    list_filter = ("tenant", "section", "status", ExpiryFilter)
    list_select_related = ("tenant", "section")
    search_fields = ("learner_ref",)
    date_hierarchy = "expires_at"
    raw_id_fields = ("section",)

    @admin.display(description="learner", ordering="learner_ref")
    def learner_ref_cell(self, hold):
        return learner(hold.learner_ref)

    @admin.display(description="section", ordering="section__title")
    def section_cell(self, hold):
        return format_html("{}<br><small>{}</small>", hold.section, hold.tenant)

    @admin.display(description="state", ordering="status")
    def state_badge(self, hold):
        key = hold.status
        if key == SeatHold.Status.HELD and hold.expires_at <= timezone.now():
            return format_html('{}<br><small>awaiting cleanup</small>', display.badge(
                "expired", "expired", "expired, awaiting cleanup"))
        return state_badge(HOLD_BADGES, key, "status")

    @admin.display(description="expires", ordering="expires_at")
    def expires(self, hold):
        return display.moment_html(hold.expires_at, relative=True)

    @admin.display(description="last change", ordering="updated_at")
    def updated(self, hold):
        return display.moment_html(hold.updated_at, relative=True)


@admin.register(Section)
class SectionAdmin(ConsoleAdmin):
    list_display = ("title", "tenant_cell", "seats")
    list_filter = ("tenant",)
    list_select_related = ("tenant",)
    search_fields = ("title",)

    @admin.display(description="tenant", ordering="tenant__name")
    def tenant_cell(self, section):
        # A method, not the field: Django keeps a foreign key's cell on one line, and a
        # university's name is long.
        return str(section.tenant)

    @admin.display(description="capacity", ordering="capacity")
    def seats(self, section):
        return display.number(section.capacity)


@admin.register(Tenant)
class TenantAdmin(ConsoleAdmin):
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
class ReminderAdmin(ConsoleAdmin):
    """Read-only: reminders follow their holds (the services) and cleanup's marking."""

    list_display = ("id", "learner_ref_cell", "hold_id", "state_badge", "due", "sent")
    list_filter = ("state", DueFilter, "tenant")
    list_select_related = ("tenant",)
    search_fields = ("learner_ref", "=hold__id")
    date_hierarchy = "due_at"
    readonly_fields = ("tenant", "hold_id", "learner_ref", "state", "due_at", "ready_at",
                       "claimed_at", "sent_at", "attempts", "failure", "last_error",
                       "created_at", "updated_at")
    fields = readonly_fields

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="learner", ordering="learner_ref")
    def learner_ref_cell(self, reminder):
        return learner(reminder.learner_ref, reminder.tenant)

    @admin.display(description="state", ordering="state")
    def state_badge(self, reminder):
        key = reminder.state
        if key == "pending" and reminder.due_at <= timezone.now():
            key = "overdue"
        badge = state_badge(REMINDER_BADGES, key, "state")
        if key == Reminder.State.FAILED and reminder.failure:
            # Why, on a line of its own: refused, not a mail address, gave up.
            return format_html('{}<br><small title="{}">{}</small>', badge,
                               reminder.last_error, reminder.get_failure_display())
        return badge

    @admin.display(description="due", ordering="due_at")
    def due(self, reminder):
        return display.moment_html(reminder.due_at, relative=True)

    @admin.display(description="sent", ordering="sent_at")
    def sent(self, reminder):
        return display.moment_html(reminder.sent_at)


@admin.register(ReminderAttempt)
class ReminderAttemptAdmin(ConsoleAdmin):
    list_display = ("id", "learner_ref_cell", "hold_id", "channel", "sent", "message")
    list_filter = ("tenant", "channel")
    list_select_related = ("tenant",)
    date_hierarchy = "sent_at"

    @admin.display(description="learner", ordering="learner_ref")
    def learner_ref_cell(self, attempt):
        return learner(attempt.learner_ref, attempt.tenant)

    @admin.display(description="sent", ordering="sent_at")
    def sent(self, attempt):
        return display.moment_html(attempt.sent_at, relative=True)

    @admin.display(description="message id", ordering="message_id")
    def message(self, attempt):
        return shortened(attempt.message_id, MESSAGE_ID_PREVIEW)


class ReadOnlyAdmin(ConsoleAdmin):
    """A ledger: rows written by the services alone."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class JoinWaitlistForm(forms.ModelForm):
    """Adding an entry is joining the line, through the service: its refusals (a seat is
    free, the learner holds one already) become the form's errors."""

    class Meta:
        model = WaitlistEntry
        fields = ("section", "learner_ref")

    def clean(self):
        cleaned = super().clean()
        if self.errors:
            return cleaned
        try:
            # Inside the admin's transaction: a later error rolls the entry back too.
            self.instance = join_waitlist(cleaned["section"].pk, cleaned["learner_ref"])
        except ReservationError as refused:
            raise forms.ValidationError(str(refused)) from None
        return cleaned


@admin.register(WaitlistEntry)
class WaitlistEntryAdmin(ReadOnlyAdmin):
    """Learners join here through the service; nothing is edited by hand: offers come
    from freed seats, and an edit would skip the section's lock."""

    form = JoinWaitlistForm
    raw_id_fields = ("section",)
    list_display = ("id", "section", "learner_ref_cell", "state_badge", "joined", "offered",
                    "offer_hold_id")
    list_filter = ("state", "section__tenant", "section")
    list_select_related = ("section",)
    search_fields = ("learner_ref", "=offer_hold_id")
    date_hierarchy = "joined_at"

    def has_add_permission(self, request):
        return request.user.has_perm("reservations.add_waitlistentry")

    def save_model(self, request, obj, form, change):
        """Nothing to save: the form's join_waitlist wrote the entry."""

    @admin.display(description="learner", ordering="learner_ref")
    def learner_ref_cell(self, entry):
        return learner(entry.learner_ref)

    @admin.display(description="state", ordering="state")
    def state_badge(self, entry):
        return state_badge(WAITLIST_BADGES, entry.state, "state")

    @admin.display(description="joined", ordering="joined_at")
    def joined(self, entry):
        return display.moment_html(entry.joined_at, relative=True)

    @admin.display(description="offered", ordering="offered_at")
    def offered(self, entry):
        return display.moment_html(entry.offered_at)


@admin.register(FreedSeat)
class FreedSeatAdmin(ReadOnlyAdmin):
    list_display = ("id", "section", "hold_id", "outcome_badge", "entry_id", "event_key",
                    "recorded")
    list_filter = ("outcome", "section")
    list_select_related = ("section",)
    search_fields = ("=hold_id", "event_key")
    date_hierarchy = "recorded_at"

    @admin.display(description="outcome", ordering="outcome")
    def outcome_badge(self, freed):
        return state_badge(FREED_SEAT_BADGES, freed.outcome, "outcome")

    @admin.display(description="recorded", ordering="recorded_at")
    def recorded(self, freed):
        return display.moment_html(freed.recorded_at, relative=True)


@admin.register(OfferMail)
class OfferMailAdmin(ReadOnlyAdmin):
    list_display = ("id", "message", "learner_ref_cell", "section", "sent")
    list_select_related = ("entry__section",)
    search_fields = ("message_id", "entry__learner_ref")
    date_hierarchy = "sent_at"

    @admin.display(description="message id", ordering="message_id")
    def message(self, mail):
        return shortened(mail.message_id, MESSAGE_ID_PREVIEW)

    @admin.display(description="learner", ordering="entry__learner_ref")
    def learner_ref_cell(self, mail):
        return learner(mail.entry.learner_ref)

    @admin.display(description="section", ordering="entry__section__title")
    def section(self, mail):
        return str(mail.entry.section)

    @admin.display(description="sent", ordering="sent_at")
    def sent(self, mail):
        return display.moment_html(mail.sent_at, relative=True)
